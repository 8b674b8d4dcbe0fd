"""The per-topic series are capped: topics that hold ids cannot grow /metrics without bound."""

from __future__ import annotations

import asyncio
import logging

import pytest

from relay.loop import Relay
from relay.metrics import OTHER_TOPICS, TOPIC_SERIES_MAX, Metrics
from relay.sinks.memory import MemorySink
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, run_until


def published_series(metrics: Metrics) -> dict[str, float]:
    return {
        sample.labels["topic"]: sample.value
        for family in metrics.published.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_the_first_topics_keep_their_series_and_the_rest_share_one(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(max_topics=3)
    for n in range(50):
        metrics.published.labels(f"order-{n}").inc(2)
    metrics.published.labels("order-1").inc()  # a topic seen early keeps its own series
    series = published_series(metrics)
    assert series == {"order-0": 2, "order-1": 3, "order-2": 2, OTHER_TOPICS: 94}
    assert len([r for r in caplog.records if getattr(r, "action", None) == "metrics_topics_capped"]) == 1
    text = metrics.render().decode()
    assert text.count("outbox_relay_published_total{") == 4


def test_the_default_cap_bounds_the_exposition() -> None:
    metrics = Metrics()
    for n in range(TOPIC_SERIES_MAX * 3):
        metrics.published.labels(f"customer.{n}.events").inc()
    series = published_series(metrics)
    assert len(series) == TOPIC_SERIES_MAX + 1
    assert sum(series.values()) == TOPIC_SERIES_MAX * 3


def test_the_loop_counts_through_the_cap() -> None:
    store, sink = MemoryStore(), MemorySink()
    for n in range(40):
        store.insert(f"tenant-{n}", {"n": n})
    relay = Relay(store, sink, FAST, metrics=Metrics(max_topics=5))
    asyncio.run(run_until(relay, lambda: not store.rows))
    series = published_series(relay.metrics)
    assert len(series) == 6 and series[OTHER_TOPICS] == 35 and sum(series.values()) == 40


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="max_topics"):
        Metrics(max_topics=-1)


def test_logging_is_quiet_below_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    metrics = Metrics(max_topics=10)
    for n in range(10):
        metrics.published.labels(f"t{n}").inc()
    assert not caplog.records
