"""How the Kafka sink reads librdkafka's errors: permanent, unreachable, or the producer's own state."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from relay.events import Failure

MAX_ERROR_CHARS = 200

_E = KafkaError

#: Errors that no retry can fix: the event is dead-lettered at once.
PERMANENT_ERRORS = frozenset(
    {
        _E.MSG_SIZE_TOO_LARGE,
        _E.INVALID_MSG_SIZE,
        _E.RECORD_LIST_TOO_LARGE,
        _E.INVALID_RECORD,
        _E.UNKNOWN_TOPIC_OR_PART,
        _E._UNKNOWN_TOPIC,
        _E._UNKNOWN_PARTITION,
        _E.TOPIC_AUTHORIZATION_FAILED,
        _E.TOPIC_EXCEPTION,
        _E.POLICY_VIOLATION,
        _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        _E._INVALID_ARG,
        _E._BAD_MSG,
    }
)

#: Errors that mean the cluster could not be reached (or would not let us in).
#: A batch that failed only with these raises ``SinkUnavailable``, so the relay
#: backs off without spending the events' attempts.
UNREACHABLE_ERRORS = frozenset(
    {
        _E._MSG_TIMED_OUT,
        _E._TIMED_OUT,
        _E._TIMED_OUT_QUEUE,
        _E._TRANSPORT,
        _E._ALL_BROKERS_DOWN,
        _E._RESOLVE,
        _E._QUEUE_FULL,
        _E._AUTHENTICATION,
        _E._SSL,
        _E.SASL_AUTHENTICATION_FAILED,
        _E.REQUEST_TIMED_OUT,
        _E.NETWORK_EXCEPTION,
        _E.BROKER_NOT_AVAILABLE,
        _E.LEADER_NOT_AVAILABLE,
        _E.NOT_ENOUGH_REPLICAS,
        _E.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    }
)

#: Errors that say no acknowledgement came in time: the broker may have stored the
#: message anyway, so sending it again may store a copy.
TIMEOUT_ERRORS = frozenset({_E._MSG_TIMED_OUT, _E._TIMED_OUT, _E.REQUEST_TIMED_OUT})

#: Errors that say the producer's idempotence state (producer id, epoch,
#: sequence numbers) is out of step with the broker: no retry through this
#: producer can succeed, a new producer can, and the event is not to blame.
PRODUCER_STATE_ERRORS = frozenset(
    {
        _E.PRODUCER_FENCED,
        _E.INVALID_PRODUCER_EPOCH,
        _E.UNKNOWN_PRODUCER_ID,
        _E.OUT_OF_ORDER_SEQUENCE_NUMBER,
        _E.INVALID_PRODUCER_ID_MAPPING,
        _E._FENCED,
        # A gap in a partition's sequence (enable.gapless.guarantee), or the fatal state itself.
        _E._GAPLESS_GUARANTEE,
        _E._FATAL,
    }
)

#: The reports of messages the relay purged from a producer it retires: not
#: acknowledged, and (those already sent) possibly stored.
PURGED_ERRORS = frozenset({_E._PURGE_QUEUE, _E._PURGE_INFLIGHT})


def describe(error: KafkaError) -> str:
    """A short, payload-free description of ``error`` for logs and ``last_error``."""
    return f"kafka {error.name()}: {error.str()}"[:MAX_ERROR_CHARS]


def classify(error: KafkaError) -> Failure:
    """Turn a delivery or produce error into a :class:`Failure`."""
    code = error.code()
    return Failure(describe(error), permanent=code in PERMANENT_ERRORS, timed_out=code in TIMEOUT_ERRORS)


def is_unreachable(error: KafkaError) -> bool:
    """Whether ``error`` says the cluster could not be reached rather than refused a message."""
    return error.code() in UNREACHABLE_ERRORS


def is_fatal(error: KafkaError) -> bool:
    """Whether ``error`` ends the producer (a fatal error, or the idempotence state lost)."""
    return error.fatal() or error.code() in PRODUCER_STATE_ERRORS


def error_of(exc: KafkaException) -> KafkaError:
    """The ``KafkaError`` a ``KafkaException`` carries (or one made from its text)."""
    if exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return KafkaError(KafkaError._FAIL, str(exc)[:MAX_ERROR_CHARS])
