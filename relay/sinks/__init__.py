"""Broker adapters behind the :class:`relay.sinks.base.Sink` port."""

from __future__ import annotations

from collections.abc import Sequence

from relay.config import RouteConfig, SinkConfig
from relay.sinks.base import Sink
from relay.sinks.formats import DEFAULT_EVENT_SOURCE, gives_way
from relay.sinks.registry import SINK_KINDS
from relay.sinks.routing import Route, RoutingSink


def build_sink(config: SinkConfig, *, publish_timeout_seconds: float, event_source: str = DEFAULT_EVENT_SOURCE) -> Sink:
    """The sink of ``config``, built by its kind (:mod:`relay.sinks.registry`); a kind's broker
    library is imported only when its sink is built.

    ``event_source`` is the CloudEvents ``source`` of a sink whose format is CloudEvents."""
    kind = SINK_KINDS.of(config)
    sink = kind.build(config, publish_timeout_seconds=publish_timeout_seconds, event_source=event_source)
    if sink.chains_keys != kind.chains_keys:
        # The loop claims a key's next events ahead on the sink's word: the two must agree.
        raise TypeError(f"the {kind.name} sink says chains_keys={sink.chains_keys}, its registration the opposite")
    return sink


def header_refusal(config: SinkConfig, name: str) -> str | None:
    """Why a sink of ``config`` could never send a header ``name`` that every event carries (a
    ``--field-header``'s), or None: checked at start, not found out event by event."""
    kind = SINK_KINDS.of(config)
    if why := kind.refuses_header(name):
        return why
    if gives_way(config.format, name, kind.binding_header):
        return (
            f"with format={config.format.value} the header {name!r} is CloudEvents' own (or the relay's),"
            " so the column's value would never be sent; pick another name"
        )
    return None


def publish_grace_seconds(config: SinkConfig) -> float:
    """How long a publish to the sink of ``config`` may run past ``--publish-timeout`` (its kind's grace)."""
    return SINK_KINDS.of(config).grace_seconds()


def sink_kind_name(config: SinkConfig) -> str:
    """The name of the kind of ``config`` (``kafka``, ``amqp``), for messages."""
    return SINK_KINDS.of(config).name


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


__all__ = [
    "Route",
    "RoutingSink",
    "Sink",
    "build_router",
    "build_sink",
    "header_refusal",
    "publish_grace_seconds",
    "sink_kind_name",
]
