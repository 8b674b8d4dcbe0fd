"""Trace context for events: ``publish`` stamps the current span into the headers.

OpenTelemetry is optional (the ``tracing`` extra). Without it, or without a
valid current span, the headers pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACE_HEADERS = frozenset({"traceparent", "tracestate"})


@cache
def _opentelemetry() -> tuple[TraceContextTextMapPropagator, Callable[[], Span]] | None:
    # Cached so an application without OpenTelemetry pays for the failed import
    # once, not on every publish.
    try:
        from opentelemetry.trace import get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return TraceContextTextMapPropagator(), get_current_span


def with_trace_context(headers: Mapping[str, str] | None) -> dict[str, str]:
    """``headers`` plus ``traceparent`` (and a non-empty ``tracestate``) of the current span.

    Always W3C Trace Context, whatever global propagators the application set,
    because the relay reads exactly these headers to link its spans. Headers
    the caller set win: if either trace header is present (in any case), the
    trace context is left as the caller gave it.
    """
    result = dict(headers) if headers else {}
    otel = _opentelemetry()
    # `result and`: no generator set up for the many events without headers.
    if otel is None or (result and any(name.lower() in TRACE_HEADERS for name in result)):
        return result
    propagator, get_current_span = otel
    if not get_current_span().get_span_context().is_valid:
        return result
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    result.update((name, value) for name, value in carrier.items() if name in TRACE_HEADERS and value)
    return result
