"""Sink URLs: ``kafka://...`` and ``amqp(s)://...`` parsed into their configurations, and the
message formats (``format=``) every sink takes.

:func:`parse_sink_url` asks the sink kinds (:mod:`relay.sinks.registry`) at call
time which parser a scheme takes; the parsers of the two built-in kinds live
here. Every error is one line and shows no secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from relay.errors import ConfigError
from relay.kafka_options import check_value, option_name
from relay.secrets import Scrubber, ambiguity, is_secret_option, redact_url, shown_before_space

#: The most bytes of UTF-8 in an AMQP 0-9-1 short string: an exchange or vhost name, a routing key.
AMQP_SHORTSTR_MAX_BYTES = 255


class Format(StrEnum):
    """How a sink shapes its messages: the sink URL option ``format=``."""

    #: The relay's own shape (CONTRACT.md, "What arrives downstream").
    NATIVE = "native"
    #: CloudEvents 1.0, binary content mode: attributes in headers, the payload as the value.
    CLOUDEVENTS = "cloudevents"
    #: CloudEvents 1.0, structured content mode: the value is an ``application/cloudevents+json`` envelope.
    CLOUDEVENTS_STRUCTURED = "cloudevents-structured"


#: The sink URL option that picks a :class:`Format`; the relay's own, never passed to a broker client.
FORMAT_OPTION = "format"
#: The sink URL option that has the relay declare its RabbitMQ exchange, and the types it may declare.
DECLARE_OPTION = "declare"
EXCHANGE_TYPES = ("topic", "direct", "fanout", "headers")


def parse_format(text: str) -> Format:
    """The :class:`Format` named ``text``; ``ConfigError`` naming the allowed ones otherwise."""
    try:
        return Format(text)
    except ValueError:
        allowed = ", ".join(f.value for f in Format)
        raise ConfigError(f"invalid sink option format={text[:40]!r}: use one of {allowed}") from None


@dataclass(frozen=True, slots=True)
class KafkaSinkConfig:
    """Where and how to reach Kafka; ``options`` are extra librdkafka settings."""

    bootstrap_servers: str
    options: dict[str, str] = field(default_factory=dict, repr=False)
    format: Format = Format.NATIVE

    def __repr__(self) -> str:
        shown = {k: ("***" if is_secret_option(k) else v) for k, v in self.options.items()}
        return (
            f"KafkaSinkConfig(bootstrap_servers={self.bootstrap_servers!r}, options={shown!r}, "
            f"format={self.format.value!r})"
        )


@dataclass(frozen=True, slots=True)
class AmqpSinkConfig:
    """Where and how to reach RabbitMQ. ``url`` is for pika and holds the password."""

    url: str = field(repr=False)
    exchange: str = ""
    format: Format = Format.NATIVE
    #: ``declare=TYPE``: the relay declares ``exchange`` (durable, of this type) on every connect,
    #: instead of only checking that it exists. None: it must exist already.
    declare: str | None = None

    def __repr__(self) -> str:
        return (
            f"AmqpSinkConfig(url={redact_url(self.url)!r}, exchange={self.exchange!r}, "
            f"format={self.format.value!r}, declare={self.declare!r})"
        )


class SinkConfig(Protocol):
    """A sink URL parsed by its kind (see :mod:`relay.sinks.registry`): ``KafkaSinkConfig``,
    ``AmqpSinkConfig`` or a registered kind's own. Frozen and comparable; its repr shows no secret."""

    @property
    def format(self) -> Format:
        """The message shape (``format=`` in the URL)."""
        ...


def parse_sink_url(url: str) -> SinkConfig:
    """Parse a sink URL (``kafka://...``, ``amqp(s)://...`` or a registered kind's) into its configuration."""
    from relay.sinks.registry import SINK_KINDS  # the kinds import this module

    url = url.strip()
    if not url:
        raise ConfigError("no sink configured: set --sink or RELAY_SINK (kafka://... or amqp://...), or --route")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if not scheme:
        # No scheme://: nothing tells a host from a password set in the URL's place, so none of it is shown.
        raise ConfigError("invalid sink URL: it has no scheme://; use kafka://... or amqp://...")
    kind = SINK_KINDS.for_scheme(scheme)
    if kind is None:
        known = " or ".join(f"{s}://" for s in SINK_KINDS.schemes())
        raise ConfigError(f"unknown sink scheme {scheme!r} in {redact_url(url)!r}: use {known}")
    problem = ambiguity(url)
    if problem is not None:
        raise ConfigError(f"invalid sink URL {shown_before_space(url)!r}: it {problem}")
    return kind.parse(url)


def parse_kafka_url(url: str) -> KafkaSinkConfig:
    # urlsplit cannot take a host list with ports, so split the netloc by hand.
    rest = url.split("://", 1)[1]
    netloc, _, query = rest.partition("?")
    netloc = netloc.rstrip("/")
    options: dict[str, str] = {}
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        options["sasl.username"] = unquote(user)
        options["sasl.password"] = unquote(password)
    hosts = [h for h in netloc.split(",") if h]
    if not hosts:
        raise ConfigError(f"kafka sink URL {redact_url(url)!r} names no broker (kafka://host:port)")
    for host in hosts:
        name, sep, port = host.rpartition(":")
        if not sep or not name or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            shown = Scrubber.of(url)(host)
            raise ConfigError(f"kafka broker {shown!r} in {redact_url(url)!r} is not host:port")
    chosen = Format.NATIVE
    # Under librdkafka's names: sasl_username and sasl.username, or a user in the URL, are one option.
    given = set(options)
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == FORMAT_OPTION:
            _once(url, key, given)
            chosen = parse_format(value)
            continue
        name = option_name(key)
        _once(url, name, given)
        check_value(name, value)
        options[name] = value
    return KafkaSinkConfig(bootstrap_servers=",".join(hosts), options=options, format=chosen)


def _once(url: str, name: str, given: set[str]) -> None:
    """Note option ``name`` of sink ``url`` as given; ``ConfigError`` if it was already.

    A repeat is a mistake (an edit that left the old value behind), not an
    override: taking the last silently could send to the wrong exchange or in
    the wrong format. Every option of a sink URL takes one value.
    """
    if name in given:
        shown = Scrubber.of(url)(name[:60])
        raise ConfigError(f"sink option {shown!r} is given twice in {redact_url(url)!r}: give it once")
    given.add(name)


def parse_amqp_url(url: str) -> AmqpSinkConfig:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - urlsplit checks the port lazily
    except ValueError as exc:
        raise ConfigError(f"invalid sink URL {redact_url(url)!r}: {Scrubber.of(url)(str(exc))}") from None
    if not parts.hostname:
        raise ConfigError(f"amqp sink URL {redact_url(url)!r} names no host (amqp://user:pass@host:port/vhost)")
    query = parse_qsl(parts.query, keep_blank_values=True)
    exchange = ""
    chosen = Format.NATIVE
    declare: str | None = None
    kept = []
    given: set[str] = set()
    for key, value in query:
        _once(url, key, given)
        if key == "exchange":
            exchange = value
        elif key == FORMAT_OPTION:
            chosen = parse_format(value)
        elif key == DECLARE_OPTION:
            declare = _exchange_type(url, value)
        else:
            kept.append(f"{key}={value}")
    _check_short_string(url, "exchange", exchange)
    if declare is not None and not exchange:
        raise ConfigError(
            f"sink option declare={declare} in {redact_url(url)!r} needs a named exchange (&exchange=NAME):"
            " the default exchange always exists and cannot be declared"
        )
    # As pika reads it: the path after its first "/", unquoted; none (or "/") is the default vhost.
    _check_short_string(url, "vhost", unquote(parts.path[1:]))
    pika_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), ""))
    return AmqpSinkConfig(url=pika_url, exchange=exchange, format=chosen, declare=declare)


def _exchange_type(url: str, value: str) -> str:
    """The exchange type of a ``declare=`` option; ``ConfigError`` for any other value."""
    if value not in EXCHANGE_TYPES:
        shown = Scrubber.of(url)(value[:40])
        raise ConfigError(f"invalid sink option declare={shown!r}: use one of {', '.join(EXCHANGE_TYPES)}")
    return value


def _check_short_string(url: str, what: str, name: str) -> None:
    """``ConfigError`` unless ``name`` fits an AMQP short string.

    The broker never sees a longer one: pika fails while encoding it, and the
    sink would report RabbitMQ unreachable (a route down for good) instead of
    the name that cannot work.
    """
    size = len(name.encode())
    if size > AMQP_SHORTSTR_MAX_BYTES:
        raise ConfigError(
            f"the {what} name in amqp sink URL {redact_url(url)[:80]!r}... is {size} bytes of UTF-8; "
            f"AMQP allows at most {AMQP_SHORTSTR_MAX_BYTES}"
        )
