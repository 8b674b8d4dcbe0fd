"""Which librdkafka options a Kafka sink URL may set, and why the others are refused.

The relay promises that a key always lands on the partition a Java producer
would pick, that the events of a key reach Kafka in the order they were
written, and that an event leaves the outbox only when the broker acknowledged
it under ``acks=all`` and idempotence. Options that would change one of those
are refused with a one-line configuration error, before anything runs. Every
other producer option librdkafka documents (CONFIGURATION.md) is allowed;
unknown names and consumer options are refused too, so a typo is not silently
ignored. docs/delivery.md lists the refused options.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from relay.errors import ConfigError
from relay.secrets import normalise_option

_PARTITIONS = "decides which partition a key goes to (the relay uses murmur2_random, Java's default partitioner)"
_ORDER = "can reorder or drop messages of one key"
_RETRIES = "a message whose retries run out fails while later messages of its key get through: order is lost"
_REPORTS = "changes what a delivery report means"
_TIMEOUT = "is set by the relay (0: a message expiring mid-run leaves a gap; --publish-timeout purges instead)"
_API_OBJECT = "is a callback or API object, set by the relay or not settable from a URL"
_VERSIONS = "idempotence and headers need the protocol versions the broker announces"

#: Option (librdkafka's name) -> why a sink URL may not set it.
REFUSED: dict[str, str] = {
    "partitioner": _PARTITIONS,
    "partitioner_cb": _PARTITIONS,
    "max.in.flight.requests.per.connection": f"{_ORDER} (idempotence keeps order only at librdkafka's own setting)",
    "max.in.flight": f"{_ORDER} (idempotence keeps order only at librdkafka's own setting)",
    "message.send.max.retries": _RETRIES,
    "retries": _RETRIES,
    "enable.gapless.guarantee": "is set by the relay (true): a gap stops the producer, which the relay replaces",
    "queuing.strategy": _ORDER,
    "msg_order_cmp": _ORDER,
    "transactional.id": "makes a transactional producer, whose messages need transactions the relay does not run",
    "transaction.timeout.ms": "belongs to transactions, and overrides message.timeout.ms",
    "message.timeout.ms": _TIMEOUT,
    "delivery.timeout.ms": _TIMEOUT,
    "topic.metadata.propagation.max.ms": "is set from --publish-timeout: a missing topic is reported before a timeout",
    "delivery.report.only.error": "would leave successes unreported: every batch would time out and go again",
    "dr_cb": _REPORTS,
    "dr_msg_cb": _REPORTS,
    "on_delivery": _REPORTS,
    "topic.blacklist": "makes topics look missing, so their events would be dead-lettered",
    "plugin.library.paths": "loads plugins whose interceptors can change messages and delivery reports",
    "interceptors": "can change messages and delivery reports",
    "api.version.request": _VERSIONS,
    "api.version.fallback.ms": _VERSIONS,
    "broker.version.fallback": _VERSIONS,
    "socket.max.fails": "other values can leave client and broker out of step after a timed-out request",
    "bootstrap.servers": "comes from the URL's host list (kafka://host:port,host:port)",
    "metadata.broker.list": "comes from the URL's host list (kafka://host:port,host:port)",
    **dict.fromkeys(
        [
            "error_cb", "throttle_cb", "stats_cb", "log_cb", "background_event_cb", "socket_cb", "connect_cb",
            "closesocket_cb", "open_cb", "resolve_cb", "oauthbearer_token_refresh_cb", "ssl.certificate.verify_cb",
            "opaque", "default_topic_conf", "enabled_events", "ssl_key", "ssl_certificate", "ssl_ca",
            "ssl_engine_callback_data", "logger", "oauth_cb",
        ],
        _API_OBJECT,
    ),
}  # fmt: skip

#: Settings the relay relies on: the value it needs, and the spellings of it that are accepted.
REQUIRED_VALUES: dict[str, tuple[str, frozenset[str]]] = {
    "acks": ("all", frozenset({"all", "-1"})),
    "request.required.acks": ("all", frozenset({"all", "-1"})),
    "enable.idempotence": ("true", frozenset({"true", "1"})),
}

#: Every other producer and common option of librdkafka's CONFIGURATION.md.
ALLOWED = frozenset(
    """
    builtin.features client.id message.max.bytes message.copy.max.bytes receive.message.max.bytes
    metadata.recovery.strategy metadata.recovery.rebootstrap.trigger.ms topic.metadata.refresh.interval.ms
    metadata.max.age.ms topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.fast.cnt
    topic.metadata.refresh.sparse debug socket.timeout.ms socket.blocking.max.ms socket.send.buffer.bytes
    socket.receive.buffer.bytes socket.keepalive.enable socket.nagle.disable broker.address.ttl
    broker.address.family socket.connection.setup.timeout.ms connections.max.idle.ms reconnect.backoff.jitter.ms
    reconnect.backoff.ms reconnect.backoff.max.ms statistics.interval.ms log_level log.queue log.thread.name
    enable.random.seed log.connection.close internal.termination.signal api.version.request.timeout.ms
    allow.auto.create.topics security.protocol ssl.cipher.suites ssl.curves.list ssl.sigalgs.list
    ssl.key.location ssl.key.password ssl.key.pem ssl.certificate.location ssl.certificate.pem ssl.ca.location
    https.ca.location https.ca.pem ssl.ca.pem ssl.ca.certificate.stores ssl.crl.location ssl.keystore.location
    ssl.keystore.password ssl.providers ssl.engine.location ssl.engine.id enable.ssl.certificate.verification
    ssl.endpoint.identification.algorithm sasl.mechanisms sasl.mechanism sasl.kerberos.service.name
    sasl.kerberos.principal sasl.kerberos.kinit.cmd sasl.kerberos.keytab sasl.kerberos.min.time.before.relogin
    sasl.username sasl.password sasl.oauthbearer.config enable.sasl.oauthbearer.unsecure.jwt
    sasl.oauthbearer.method sasl.oauthbearer.client.id sasl.oauthbearer.client.credentials.client.id
    sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.client.secret sasl.oauthbearer.scope
    sasl.oauthbearer.extensions sasl.oauthbearer.token.endpoint.url sasl.oauthbearer.grant.type
    sasl.oauthbearer.assertion.algorithm sasl.oauthbearer.assertion.private.key.file
    sasl.oauthbearer.assertion.private.key.passphrase sasl.oauthbearer.assertion.private.key.pem
    sasl.oauthbearer.assertion.file sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
    sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
    sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub
    sasl.oauthbearer.assertion.jwt.template.file sasl.oauthbearer.metadata.authentication.type client.rack
    retry.backoff.ms retry.backoff.max.ms client.dns.lookup enable.metrics.push
    queue.buffering.max.messages queue.buffering.max.kbytes queue.buffering.max.ms linger.ms
    queue.buffering.backpressure.threshold compression.codec compression.type compression.level batch.num.messages
    batch.size sticky.partitioning.linger.ms request.timeout.ms produce.offset.report
    """.split()  # noqa: SIM905 - a word per option reads like the table it comes from
) | frozenset(REQUIRED_VALUES)

#: The options librdkafka reads as a 32-bit whole number. It reads them with strtol and does not
#: look at what follows the digits, nor past 32 bits: batch.size=1_000 ran with 1, 1.9 with 1,
#: abc with 0 (where 0 is allowed) and 4294967297 with 1. So the relay reads them first.
INTEGER_OPTIONS = frozenset(
    """
    api.version.request.timeout.ms batch.num.messages batch.size broker.address.ttl compression.level
    connections.max.idle.ms internal.termination.signal log_level message.copy.max.bytes message.max.bytes
    metadata.max.age.ms metadata.recovery.rebootstrap.trigger.ms queue.buffering.backpressure.threshold
    queue.buffering.max.kbytes queue.buffering.max.messages receive.message.max.bytes reconnect.backoff.jitter.ms
    reconnect.backoff.max.ms reconnect.backoff.ms request.timeout.ms retry.backoff.max.ms retry.backoff.ms
    sasl.kerberos.min.time.before.relogin sasl.oauthbearer.assertion.claim.exp.seconds
    sasl.oauthbearer.assertion.claim.nbf.seconds socket.blocking.max.ms socket.connection.setup.timeout.ms
    socket.receive.buffer.bytes socket.send.buffer.bytes socket.timeout.ms statistics.interval.ms
    sticky.partitioning.linger.ms topic.metadata.refresh.fast.cnt topic.metadata.refresh.fast.interval.ms
    topic.metadata.refresh.interval.ms
    """.split()  # noqa: SIM905 - a word per option reads like the table it comes from
)
#: The options librdkafka reads as a decimal number (strtod): linger.ms=1_000 ran with 1 ms.
DECIMAL_OPTIONS = frozenset({"linger.ms", "queue.buffering.max.ms"})
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
_INT32 = range(-(2**31), 2**31)

_BY_NORMAL_NAME = {normalise_option(name): name for name in ALLOWED | frozenset(REFUSED)}
#: What a Kafka consumer would take (group.id, auto.offset.reset, ...): a mistake in a producer URL.
_CONSUMER_WORDS = ("group.", "offset", "fetch.", "session.timeout", "heartbeat", "isolation.level", "auto.commit",
                   "partition.assignment", "queued.", "max.poll", "check.crcs", "partition.eof", "consume")  # fmt: skip


def option_name(name: str) -> str:
    """librdkafka's name for URL option ``name`` (``_`` and ``.`` both accepted).

    ``ConfigError`` if a sink URL may not set it (see :data:`REFUSED`) or librdkafka has no such producer option.
    """
    canonical = _BY_NORMAL_NAME.get(normalise_option(name))
    if canonical in REFUSED:
        raise ConfigError(f"kafka option {canonical} may not be set in the sink URL: it {REFUSED[canonical]}")
    if canonical is None:
        shown = name[:60]
        if any(word in normalise_option(name) for word in _CONSUMER_WORDS):
            raise ConfigError(f"kafka option {shown!r} is a consumer option; the relay only produces: remove it")
        raise ConfigError(f"unknown kafka option {shown!r} in the sink URL (see librdkafka's CONFIGURATION.md)")
    return canonical


def check_value(name: str, value: str) -> None:
    """``ConfigError`` unless ``value`` keeps the relay's promise for option ``name`` (librdkafka's name)."""
    required = REQUIRED_VALUES.get(name)
    if required is not None and value.strip().lower() not in required[1]:
        raise ConfigError(
            f"kafka option {name}={value[:20]!r} would break delivery guarantees "
            f"(the relay needs {name}={required[0]}): remove it"
        )
    number = value.strip()  # (librdkafka skips leading spaces, and stops at trailing ones)
    if name in INTEGER_OPTIONS and not (_WHOLE_NUMBER.fullmatch(number) and int(number) in _INT32):
        raise ConfigError(
            f"kafka option {name}={value[:20]!r} is not a whole number in ASCII digits from -2**31 to 2**31-1: "
            "librdkafka would read only the digits it starts with, or wrap it around"
        )
    if name in DECIMAL_OPTIONS and (not number.isascii() or "_" in number):
        raise ConfigError(
            f"kafka option {name}={value[:20]!r} is not a number in ASCII digits without '_': "
            "librdkafka would read only the digits it starts with"
        )


def checked_options(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` under librdkafka's names, each allowed and with a value that keeps the promise."""
    checked = {}
    for name, value in options.items():
        canonical = option_name(name)
        check_value(canonical, value)
        checked[canonical] = value
    return checked
