"""The relay's metrics helpers against prometheus_client's own behaviour."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from relay.config import BATCH_SIZE
from relay.events import IDEMPOTENCY_HEADER, Event
from relay.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, observe_many


def test_a_full_default_batch_has_a_bucket_of_its_own() -> None:
    # Full batches mean a backlog: an operator reads them off the bucket at the batch size.
    assert BATCH_SIZE in BATCH_BUCKETS


def test_observe_many_counts_exactly_as_observe_does() -> None:
    values = [0.0, 0.001, 0.0010001, 0.05, 0.05, 7.5, 300, 301, 1e9] + [random.expovariate(20) for _ in range(500)]
    one, many = CollectorRegistry(), CollectorRegistry()
    each = Histogram("latency_seconds", "x", buckets=LATENCY_BUCKETS, registry=one)
    bulk = Histogram("latency_seconds", "x", buckets=LATENCY_BUCKETS, registry=many)
    for value in values:
        each.observe(value)
    observe_many(bulk, values[:300])
    observe_many(bulk, values[300:])
    observe_many(bulk, [])

    def exposition(registry: CollectorRegistry) -> list[str]:
        lines = generate_latest(registry).decode().splitlines()
        return [line for line in lines if "_created" not in line and "_sum" not in line]

    assert exposition(many) == exposition(one)
    assert bulk._sum.get() == pytest.approx(each._sum.get(), rel=1e-12)  # exposition rounds the sum


def test_header_pairs_are_the_message_headers() -> None:
    def event(headers: dict[str, str]) -> Event:
        return Event(1, "t", None, b"{}", headers, "idem", 1, None)  # type: ignore[arg-type]

    assert event({}).message_header_pairs() == [(IDEMPOTENCY_HEADER, "idem")]
    both = event({"trace": "abc", IDEMPOTENCY_HEADER: "spoofed"})
    assert both.message_header_pairs() == list(both.message_headers().items())
    assert dict(both.message_header_pairs()) == {"trace": "abc", IDEMPOTENCY_HEADER: "idem"}
