"""One registration per sink kind: how the relay knows a kind of sink, from its URL to its sink.

A :class:`SinkKind` says everything the rest of the relay asks about a kind:
the URL schemes it answers to, how its URL is parsed, how its sink is built,
how long a publish may run past ``--publish-timeout`` (the lease grace), which
header names it refuses, which it gives way to in CloudEvents formats (its
encoder family), and whether it chains keys. Nothing outside a sink's own
package asks which kind a configuration is in any other way. A configuration
no kind claims is an error, never another kind's settings.

The callables import their sink's package (and its client library) only when
called, so a relay imports only the client of the sinks it uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast

from relay.config import AmqpSinkConfig, KafkaSinkConfig, SinkConfig, parse_amqp_url, parse_kafka_url
from relay.errors import ConfigError
from relay.sinks.base import Sink


@dataclass(frozen=True, slots=True)
class SinkKind:
    """What the relay knows of one kind of sink."""

    #: Names the kind in messages (``the kafka sink``).
    name: str
    #: URL schemes in lower case, ``kafka`` for ``kafka://...``.
    schemes: tuple[str, ...]
    #: The configuration class ``parse`` returns: how a configuration finds its kind.
    config_type: type
    #: A URL of one of ``schemes`` as a configuration; ``ConfigError`` if it is invalid.
    parse: Callable[[str], SinkConfig]
    #: The sink of a configuration of this kind: ``build(config, *, publish_timeout_seconds, event_source)``.
    build: Callable[..., Sink]
    #: How long a publish may run past ``--publish-timeout`` (read when the lease is checked).
    grace_seconds: Callable[[], float]
    #: Why this kind could never send a header of this name (None: it can), whatever the format.
    refuses_header: Callable[[str], str | None]
    #: Whether a row header of this name gives way to the CloudEvents binding's own (the encoder family).
    binding_header: Callable[[str], bool]
    #: Whether the sink keeps a key's order across batches in flight (``Sink.chains_keys``).
    chains_keys: bool = True


class SinkKinds:
    """The sink kinds the relay knows, by scheme and by configuration class."""

    def __init__(self) -> None:
        self._kinds: dict[str, SinkKind] = {}

    def register(self, kind: SinkKind) -> None:
        """Add ``kind``; a scheme or name already taken is an error."""
        taken = [s for s in kind.schemes if self._by_scheme(s) is not None]
        if kind.name in self._kinds or taken:
            raise ValueError(f"sink kind {kind.name!r} clashes with one registered ({taken or kind.name})")
        self._kinds[kind.name] = kind

    def unregister(self, name: str) -> None:
        """Remove the kind ``name`` (tests that register a throwaway sink)."""
        del self._kinds[name]

    def __iter__(self) -> Iterator[SinkKind]:
        return iter(self._kinds.values())

    def schemes(self) -> list[str]:
        """Every scheme registered, for messages."""
        return [scheme for kind in self for scheme in kind.schemes]

    def for_scheme(self, scheme: str) -> SinkKind | None:
        """The kind of ``scheme`` (any case), or None."""
        return self._by_scheme(scheme.lower())

    def of(self, config: SinkConfig) -> SinkKind:
        """The kind that parsed ``config``; an unknown configuration is an error."""
        for kind in self:
            if type(config) is kind.config_type:
                return kind
        raise ConfigError(f"no sink kind is registered for {type(config).__name__}")

    def _by_scheme(self, scheme: str) -> SinkKind | None:
        return next((kind for kind in self if scheme in kind.schemes), None)


def _build_kafka(config: SinkConfig, *, publish_timeout_seconds: float, event_source: str) -> Sink:
    from relay.sinks.kafka import KafkaSink

    # The registry hands each kind only the configurations its parse made.
    return KafkaSink(
        cast(KafkaSinkConfig, config), publish_timeout_seconds=publish_timeout_seconds, event_source=event_source
    )


def _kafka_grace() -> float:
    from relay.sinks.kafka import WAIT_MARGIN_SECONDS

    # librdkafka's delivery reports for what times out at the publish timeout come a margin later.
    return WAIT_MARGIN_SECONDS


def _build_amqp(config: SinkConfig, *, publish_timeout_seconds: float, event_source: str) -> Sink:
    from relay.sinks.rabbitmq import RabbitMQSink

    return RabbitMQSink(
        cast(AmqpSinkConfig, config), publish_timeout_seconds=publish_timeout_seconds, event_source=event_source
    )


def _amqp_grace() -> float:
    from relay.sinks.rabbitmq import CLOSE_TIMEOUT_SECONDS

    # A connection that confirmed nothing is closed: up to a close timeout for the broker's
    # Close-Ok, then as long again for the aborted stream.
    return 2 * CLOSE_TIMEOUT_SECONDS


def _amqp_refuses_header(name: str) -> str | None:
    from relay.sinks.rabbitmq.limits import RESERVED, reserved, too_long

    if reserved(name):
        return f"the header {name!r} is {RESERVED}"
    if too_long(name):
        return f"the header name {name[:40]!r}... is longer than RabbitMQ's 255 bytes"
    return None


def _no_refusal(_name: str) -> str | None:
    return None


def builtin_kinds() -> SinkKinds:
    """The kinds the relay ships: Kafka and RabbitMQ."""
    from relay.sinks.formats import amqp_binding_header, kafka_binding_header

    kinds = SinkKinds()
    kinds.register(
        SinkKind(
            name="kafka",
            schemes=("kafka",),
            config_type=KafkaSinkConfig,
            parse=parse_kafka_url,
            build=_build_kafka,
            grace_seconds=_kafka_grace,
            refuses_header=_no_refusal,
            binding_header=kafka_binding_header,
        )
    )
    kinds.register(
        SinkKind(
            name="amqp",
            schemes=("amqp", "amqps"),
            config_type=AmqpSinkConfig,
            parse=parse_amqp_url,
            build=_build_amqp,
            grace_seconds=_amqp_grace,
            refuses_header=_amqp_refuses_header,
            binding_header=amqp_binding_header,
        )
    )
    return kinds


#: The kinds this relay knows. A test may register a throwaway kind (and unregister it after).
SINK_KINDS = builtin_kinds()
