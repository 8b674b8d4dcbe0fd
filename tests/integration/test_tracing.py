"""Tracing: producers stamp traceparent, the relay's batch span links to the producer spans."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState
from opentelemetry.trace.span import format_span_id, format_trace_id

import producers
from relay.tracing import MAX_LINKS, SPAN_NAME, batch_span
from tests.integration.kafka_support import consume, make_event, unique_topic
from tests.relay_support import RelayThread, outbox_counts, wait_until

CALLER_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(scope="module")
def provider() -> Iterator[TracerProvider]:
    """The process-wide SDK tracer provider (OpenTelemetry allows setting it only once)."""
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        current = TracerProvider()
        trace.set_tracer_provider(current)
    yield current


@pytest.fixture
def spans(provider: TracerProvider) -> Iterator[InMemorySpanExporter]:
    """Collects the spans finished during one test."""
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    # A provider cannot drop a processor; a stopped exporter ignores what comes later.
    exporter.shutdown()


def stored_headers(url: str, idempotency_key: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT headers FROM outbox WHERE idempotency_key = %s", [idempotency_key]).fetchone()
    assert row is not None
    headers: dict[str, str] = row[0]
    return headers


def batch_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == SPAN_NAME]


def test_trace_flows_from_publish_through_the_relay_to_kafka(
    database_url: str, kafka_bootstrap: str, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("tests")
    topic = unique_topic()
    with psycopg.connect(database_url) as conn, conn.transaction():
        with tracer.start_as_current_span("place order") as producer_span:
            producers.publish(conn, topic, {"order": 1}, key="o-1", headers={"h": "v"}, idempotency_key="traced")
        producer = producer_span.get_span_context()
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}"):
        wait_until(lambda: not outbox_counts(database_url))
    [message] = consume(kafka_bootstrap, topic, count=1)

    expected = f"00-{format_trace_id(producer.trace_id)}-{format_span_id(producer.span_id)}-{producer.trace_flags:02x}"
    assert message.headers == {"h": b"v", "traceparent": expected.encode(), "idempotency-key": b"traced"}

    [batch] = [
        span for span in batch_spans(spans) if (span.attributes or {}).get("messaging.destination.name") == topic
    ]
    assert batch.kind is SpanKind.PRODUCER
    assert batch.parent is None, "a batch mixes many requests' events: it links them, it is no one's child"
    assert dict(batch.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.batch.message_count": 1,
        "messaging.destination.name": topic,
    }
    assert [(link.context.trace_id, link.context.span_id) for link in batch.links] == [
        (producer.trace_id, producer.span_id)
    ]


def test_publish_without_an_active_span_adds_no_trace_headers(database_url: str, spans: InMemorySpanExporter) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "t", {}, headers={"h": "v"}, idempotency_key="plain")
        producers.publish(conn, "t", {}, idempotency_key="bare")
        conn.commit()
    assert stored_headers(database_url, "plain") == {"h": "v"}
    assert stored_headers(database_url, "bare") == {}


def test_a_traceparent_the_caller_set_wins(database_url: str) -> None:
    remote = SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True, trace_state=TraceState([("vendor", "x")]))
    with psycopg.connect(database_url) as conn, trace.use_span(NonRecordingSpan(remote)):
        producers.publish(conn, "t", {}, headers={"traceparent": CALLER_TRACEPARENT}, idempotency_key="caller")
        producers.publish(conn, "t", {}, headers={"TraceState": "mine=1"}, idempotency_key="caller-state")
        conn.commit()
    assert stored_headers(database_url, "caller") == {"traceparent": CALLER_TRACEPARENT}
    assert stored_headers(database_url, "caller-state") == {"TraceState": "mine=1"}


def test_tracestate_is_added_when_the_span_has_one_also_by_apublish(database_url: str) -> None:
    remote = SpanContext(
        trace_id=0xABC,
        span_id=0xDEF,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "x")]),
    )

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            with trace.use_span(NonRecordingSpan(remote)):
                await producers.apublish(conn, "t", {}, idempotency_key="async")
            await conn.commit()

    asyncio.run(write())
    assert stored_headers(database_url, "async") == {
        "traceparent": f"00-{format_trace_id(0xABC)}-{format_span_id(0xDEF)}-01",
        "tracestate": "vendor=x",
    }


def _traceparent(trace_id: int, span_id: int) -> dict[str, str]:
    return {"traceparent": f"00-{format_trace_id(trace_id)}-{format_span_id(span_id)}-01"}


def test_batch_span_links_distinct_producers_up_to_the_cap(spans: InMemorySpanExporter) -> None:
    events = [make_event("a", headers=_traceparent(1, 1)), make_event("a", headers=_traceparent(1, 1))]
    events += [make_event("b"), make_event("b", headers={"traceparent": "garbage"})]
    events += [make_event("c", headers=_traceparent(2, n)) for n in range(1, MAX_LINKS + 50)]
    with batch_span(events, system="memory"):
        pass
    [span] = batch_spans(spans)
    links = [(link.context.trace_id, link.context.span_id) for link in span.links]
    assert len(links) == MAX_LINKS
    assert links[:2] == [(1, 1), (2, 1)], "one link per producer span, invalid traceparents ignored"
    assert span.attributes is not None
    assert span.attributes["messaging.batch.message_count"] == len(events)
    assert "messaging.destination.name" not in span.attributes, "several topics: no single destination"


@pytest.mark.parametrize(
    ("parent", "state"), [("Traceparent", "Tracestate"), ("TRACEPARENT", "TRACESTATE"), ("traceParent", "traceState")]
)
def test_batch_span_links_a_producer_whatever_the_case_of_the_header_name(
    spans: InMemorySpanExporter, parent: str, state: str
) -> None:
    headers = {parent: _traceparent(5, 6)["traceparent"], state: "vendor=x"}
    with batch_span([make_event("t", headers=headers)], system="kafka"):
        pass
    [span] = batch_spans(spans)
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [(5, 6)]
    assert span.links[0].context.trace_state.to_header() == "vendor=x"


def test_batch_span_records_a_failed_publish(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError, match="broker down"), batch_span([make_event("t")], system="kafka"):
        raise RuntimeError("broker down")
    [span] = batch_spans(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert [event.name for event in span.events] == ["exception"]


def test_everything_works_without_opentelemetry_installed(database_url: str) -> None:
    script = textwrap.dedent(
        """
        import sys

        sys.modules["opentelemetry"] = None  # as if the tracing extra were not installed

        import psycopg

        import producers
        import relay.loop  # noqa: F401 - imports relay.tracing
        from relay.tracing import batch_span
        from tests.integration.kafka_support import make_event

        with batch_span([make_event("t", headers={"traceparent": "x"})], system="kafka"):
            pass
        with psycopg.connect(sys.argv[1]) as conn:
            producers.publish(conn, "t", {}, headers={"h": "v"}, idempotency_key="no-otel")
        assert "opentelemetry.trace" not in sys.modules
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, database_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert stored_headers(database_url, "no-otel") == {"h": "v"}
