"""How the Kafka sink classifies errors and builds its producer settings (no broker)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from confluent_kafka import KafkaError

from relay.config import KafkaSinkConfig
from relay.errors import ConfigError
from relay.events import Failure
from relay.sinks.kafka import MAX_ERROR_CHARS, classify, describe, is_unreachable, producer_config
from relay.sinks.kafka.batch import Batch
from relay.sinks.kafka.client import LibrdkafkaLog
from tests.integration.kafka_support import make_event

PERMANENT = [
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.POLICY_VIOLATION,
]
UNREACHABLE = [
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.LEADER_NOT_AVAILABLE,
]
OTHER_TRANSIENT = [
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError._FATAL,
    KafkaError._PURGE_QUEUE,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
]


@pytest.mark.parametrize("code", PERMANENT)
def test_errors_no_retry_can_fix_are_permanent(code: int) -> None:
    failure = classify(KafkaError(code))
    assert failure.permanent
    assert not is_unreachable(KafkaError(code))


@pytest.mark.parametrize("code", UNREACHABLE + OTHER_TRANSIENT)
def test_everything_else_is_retried(code: int) -> None:
    assert not classify(KafkaError(code)).permanent


@pytest.mark.parametrize("code", UNREACHABLE)
def test_connectivity_errors_count_as_unreachable(code: int) -> None:
    assert is_unreachable(KafkaError(code))


@pytest.mark.parametrize("code", OTHER_TRANSIENT)
def test_refusals_are_not_unreachable(code: int) -> None:
    assert not is_unreachable(KafkaError(code))


def test_descriptions_are_short_and_named() -> None:
    text = describe(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert text == "kafka _MSG_TIMED_OUT: Local: Message timed out"
    assert len(describe(KafkaError(KafkaError._FAIL, "x" * 5000))) == MAX_ERROR_CHARS


def test_producer_settings_keep_the_guarantees_and_take_options() -> None:
    config = KafkaSinkConfig("b1:9092,b2:9092", options={"linger.ms": "20", "compression.type": "lz4"})
    settings = producer_config(config, publish_timeout_seconds=12.5, client_id="relay-a")
    assert settings["bootstrap.servers"] == "b1:9092,b2:9092"
    assert settings["client.id"] == "relay-a"
    assert settings["enable.idempotence"] is True
    assert settings["acks"] == "all"
    assert settings["partitioner"] == "murmur2_random"
    # No librdkafka-side expiry (a gap in a key's run); the publish deadline purges instead.
    assert settings["message.timeout.ms"] == 0
    assert settings["enable.gapless.guarantee"] is True
    assert settings["topic.metadata.propagation.max.ms"] < 12_500
    assert settings["linger.ms"] == "20"
    assert settings["compression.type"] == "lz4"


@pytest.mark.parametrize(("name", "value"), [("acks", "1"), ("enable.idempotence", "false")])
def test_options_may_not_weaken_delivery(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        producer_config(KafkaSinkConfig("b:9092", {name: value}), publish_timeout_seconds=5, client_id="r")


def test_librdkafka_logs_are_demoted_and_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="relay.sinks.kafka")
    log = LibrdkafkaLog(lambda text: text.replace("s3cret", "***"))
    log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "connect failed")
    log.log(logging.INFO, "%s [%s] %s", "STATE", "rdkafka#producer-1", "up")
    log.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1", "password s3cret ignored")
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels[0][0] == logging.DEBUG
    assert levels[1][0] == logging.DEBUG
    assert levels[2] == (logging.WARNING, "CONFWARN [rdkafka#producer-1] password *** ignored")
    assert all(getattr(r, "action", None) == "librdkafka_log" for r in caplog.records)


def test_batch_resolves_when_every_event_has_an_outcome() -> None:
    async def scenario() -> None:
        batch = Batch([make_event("t") for _ in range(3)], asyncio.get_running_loop())
        batch.on_delivery(1, None, None)
        batch.record(0, Failure("too big", permanent=True))
        assert not batch.future.done()
        batch.on_delivery(2, KafkaError(KafkaError._MSG_TIMED_OUT), None)
        await asyncio.wait_for(batch.future, 1)
        outcomes = batch.close()
        assert outcomes[0] == Failure("too big", permanent=True)
        assert outcomes[1] is None
        assert outcomes[2] is not None and "_MSG_TIMED_OUT" in outcomes[2].error
        assert (batch.acked, batch.unreachable) == (1, 1)

    asyncio.run(scenario())


def test_unreported_events_count_as_unreachable_timeouts() -> None:
    async def scenario() -> None:
        batch = Batch([make_event("t") for _ in range(2)], asyncio.get_running_loop())
        batch.on_delivery(0, KafkaError(KafkaError._TRANSPORT), None)
        outcomes = batch.close()
        batch.on_delivery(1, None, None)  # too late: ignored
        assert outcomes[1] is not None and not outcomes[1].permanent
        assert (batch.acked, batch.unreachable) == (0, 2)

    asyncio.run(scenario())


def test_failing_the_rest_keeps_earlier_outcomes() -> None:
    async def scenario() -> None:
        batch = Batch([make_event("t") for _ in range(4)], asyncio.get_running_loop())
        batch.on_delivery(0, None, None)
        batch.fail_unreported(Failure("queue full"), unreachable=True, start=2)
        assert not batch.future.done()
        batch.on_delivery(1, None, None)
        await asyncio.wait_for(batch.future, 1)
        assert batch.close() == [None, None, Failure("queue full"), Failure("queue full")]

    asyncio.run(scenario())


@pytest.mark.parametrize("raised", [ValueError("embedded null character"), TypeError("bad type"),
                                    UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")])  # fmt: skip
def test_a_value_the_client_refuses_before_sending_is_a_permanent_failure_not_a_crash(raised: Exception) -> None:
    from relay.sinks.kafka.sink import _produce

    def produce(*args: object, **kwargs: object) -> None:
        raise raised

    error = _produce(produce, make_event("t"), b"{}", [], lambda error, message: None)
    assert error is not None
    failure = classify(error)
    assert failure.permanent and "refused" in failure.error and str(raised)[:20] in failure.error, failure
