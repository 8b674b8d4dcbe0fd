"""Broker adapters behind the :class:`relay.sinks.base.Sink` port."""

from __future__ import annotations

from collections.abc import Sequence

from relay.config import AmqpSinkConfig, KafkaSinkConfig, RouteConfig, SinkConfig
from relay.sinks.base import Sink
from relay.sinks.formats import DEFAULT_EVENT_SOURCE, gives_way
from relay.sinks.routing import Route, RoutingSink


def build_sink(config: SinkConfig, *, publish_timeout_seconds: float, event_source: str = DEFAULT_EVENT_SOURCE) -> Sink:
    """The adapter for ``config``; broker libraries are imported only when used.

    ``event_source`` is the CloudEvents ``source`` of a sink whose format is CloudEvents."""
    if isinstance(config, KafkaSinkConfig):
        from relay.sinks.kafka import KafkaSink

        return KafkaSink(config, publish_timeout_seconds=publish_timeout_seconds, event_source=event_source)
    if isinstance(config, AmqpSinkConfig):
        from relay.sinks.rabbitmq import RabbitMQSink

        return RabbitMQSink(config, publish_timeout_seconds=publish_timeout_seconds, event_source=event_source)
    raise TypeError(f"no sink for {config!r}")


def header_refusal(config: SinkConfig, name: str) -> str | None:
    """Why a sink of ``config`` could never send a header ``name`` that every event carries (a
    ``--field-header``'s), or None: checked at start, not found out event by event."""
    amqp = isinstance(config, AmqpSinkConfig)
    if amqp:
        from relay.sinks.rabbitmq.limits import RESERVED, reserved, too_long

        if reserved(name):
            return f"the header {name!r} is {RESERVED}"
        if too_long(name):
            return f"the header name {name[:40]!r}... is longer than RabbitMQ's 255 bytes"
    if gives_way(config.format, name, amqp=amqp):
        return (
            f"with format={config.format.value} the header {name!r} is CloudEvents' own (or the relay's),"
            " so the column's value would never be sent; pick another name"
        )
    return None


def build_router(
    routes: Sequence[RouteConfig], *, publish_timeout_seconds: float, event_source: str = DEFAULT_EVENT_SOURCE
) -> RoutingSink:
    """A routing sink over ``routes``; routes to the same sink configuration (format
    included) share one sink, so each route has the format of its own URL."""
    built: list[tuple[SinkConfig, Sink]] = []
    chosen: list[Route] = []
    for route in routes:
        sink = next((s for config, s in built if config == route.sink), None)
        if sink is None:
            sink = build_sink(route.sink, publish_timeout_seconds=publish_timeout_seconds, event_source=event_source)
            built.append((route.sink, sink))
        chosen.append(Route(route.pattern, sink, route.label))
    return RoutingSink(chosen)


__all__ = ["Route", "RoutingSink", "Sink", "build_router", "build_sink"]
