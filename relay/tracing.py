"""OpenTelemetry spans for the relay's publishing, when OpenTelemetry is installed.

Each published batch gets one ``PRODUCER`` span, ``outbox-relay publish``. A
batch mixes events of many unrelated requests, so the span is not a child of
any of them: it links to the producer span of each event, read from the
``traceparent`` header that ``producers.publish`` stored (or any writer, in
any case: header names are case-insensitive, so ``Traceparent`` and
``TRACEPARENT`` count too). The headers themselves are forwarded unchanged, so
a consumer continues the producer's trace, not the relay's.

OpenTelemetry is optional (the ``tracing`` extra): without it, or without an
SDK configured, ``batch_span`` costs next to nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import cache
from typing import TYPE_CHECKING

from relay.events import TRACEPARENT, Event, trace_context

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SPAN_NAME = "outbox-relay publish"
TRACER_NAME = "outbox-relay"
#: Most links on one batch span (the SDK's default span link limit); the
#: events past it are still published, only not linked.
MAX_LINKS = 128


@cache
def _opentelemetry() -> tuple[Tracer, TraceContextTextMapPropagator] | None:
    # The tracer comes from the global provider; before the application sets
    # one it is a proxy that follows the provider set later, so caching is safe.
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return trace.get_tracer(TRACER_NAME), TraceContextTextMapPropagator()


def event_links(events: Sequence[Event], propagator: TraceContextTextMapPropagator) -> list[Link]:
    """One link per distinct valid ``traceparent`` among ``events``, at most :data:`MAX_LINKS`.

    The headers are read in any case (see :func:`relay.events.trace_context`).
    """
    from opentelemetry.trace import Link, get_current_span

    links: list[Link] = []
    seen: set[tuple[int, int]] = set()
    for event in events:
        if not event.headers:  # the common case, on the hot path
            continue
        carrier = trace_context(event.headers)
        if TRACEPARENT not in carrier:
            continue
        context = get_current_span(propagator.extract(carrier)).get_span_context()
        ids = (context.trace_id, context.span_id)
        if not context.is_valid or ids in seen:
            continue
        seen.add(ids)
        links.append(Link(context))
        if len(links) >= MAX_LINKS:
            break
    return links


@contextlib.contextmanager
def batch_span(events: Sequence[Event], *, system: str | None = None) -> Iterator[None]:
    """A ``PRODUCER`` span around publishing ``events``, linked to their producers' spans.

    ``system`` is the ``messaging.system`` attribute (``kafka``, ``rabbitmq``).
    An exception escaping the block is recorded on the span and re-raised. A
    no-op without OpenTelemetry.
    """
    otel = _opentelemetry()
    if otel is None:
        yield
        return
    from opentelemetry.trace import SpanKind
    from opentelemetry.util.types import AttributeValue

    tracer, propagator = otel
    attributes: dict[str, AttributeValue] = {
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.batch.message_count": len(events),
    }
    if system:
        attributes["messaging.system"] = system
    topics = {event.topic for event in events}
    if len(topics) == 1:
        attributes["messaging.destination.name"] = topics.pop()
    with tracer.start_as_current_span(
        SPAN_NAME, kind=SpanKind.PRODUCER, attributes=attributes, links=event_links(events, propagator)
    ):
        yield
