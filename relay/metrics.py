"""Prometheus series of one relay process, in a registry of its own."""

from __future__ import annotations

import logging
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relay.store.base import RetryingTopic, Status

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: A full batch at the default --batch-size has a bucket of its own (see test_metrics).
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2000, 2500, 4000, 5000)
#: Topics that get a series of their own in the per-topic counters; later ones share one.
TOPIC_SERIES_MAX = 1000
#: The label of the series the topics past the cap share: no Kafka topic can be named so.
OTHER_TOPICS = "(other)"


class Metrics:
    """Counters, gauges and histograms the relay loop updates as it works."""

    def __init__(self, *, max_topics: int = TOPIC_SERIES_MAX) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.published = TopicCounter(
            Counter("outbox_relay_published", "Events acknowledged by the broker.", ["topic"], registry=r), max_topics
        )
        self.failed_attempts = Counter(
            "outbox_relay_failed_attempts",
            "Publish attempts the broker did not acknowledge (errors and timeouts).",
            registry=r,
        )
        self.dead_lettered = Counter("outbox_relay_dead_lettered", "Events dead-lettered.", registry=r)
        self.reaped = Counter(
            "outbox_relay_reaped_leases",
            "Expired leases taken over (their relay died or stalled).",
            registry=r,
        )
        self.lost_leases = Counter(
            "outbox_relay_lost_leases",
            "Settles that found the lease taken over by another relay.",
            registry=r,
        )
        self.claims = Counter("outbox_relay_claims", "Claim queries run.", registry=r)
        self.empty_claims = Counter("outbox_relay_empty_claims", "Claim queries that found nothing.", registry=r)
        self.pending = Gauge("outbox_relay_pending", "Events waiting to be published.", registry=r)
        self.in_flight = Gauge("outbox_relay_in_flight", "Events leased and not yet settled.", registry=r)
        self.failed = Gauge("outbox_relay_failed", "Dead-lettered events in the table.", registry=r)
        self.parked_keys = Gauge("outbox_relay_parked_keys", "Keys held back by a dead-lettered event.", registry=r)
        self.scheduled = Gauge("outbox_relay_scheduled", "Pending events not due yet (deliver_at ahead).", registry=r)
        self.keys_waiting_on_schedule = Gauge(
            "outbox_relay_keys_waiting_on_schedule", "Keys whose due events wait behind a not-yet-due one.", registry=r
        )
        self.oldest_pending_age = Gauge(
            "outbox_relay_oldest_pending_age_seconds", "Age of the oldest due, unpublished event.", registry=r
        )
        self.retrying = RetryingTopics(max_topics)
        r.register(self.retrying)
        #: Events acknowledged, all topics: what the progress line counts (see relay/progress.py).
        self.sent_events = 0
        self.publish_latency = Histogram(
            "outbox_relay_publish_latency_seconds",
            "From the event's insert to the broker's acknowledgement.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "outbox_relay_batch_size", "Events per claimed batch.", buckets=BATCH_BUCKETS, registry=r
        )
        self.claim_duration = Histogram(
            "outbox_relay_claim_duration_seconds",
            "Time the claim query took.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def observe_slot(self, lag_bytes: int | None, lag_seconds: float | None, wal_status: str | None) -> None:
        """Copy what the log source saw of its slot into the slot gauges (created at the first reading)."""
        if not hasattr(self, "slot_lag_bytes"):
            r = self.registry
            self.slot_lag_bytes = Gauge(
                "outbox_relay_slot_lag_bytes", "WAL bytes between the server's end and the slot's confirmed position.",
                registry=r,
            )  # fmt: skip
            self.slot_lag_seconds = Gauge(
                "outbox_relay_slot_lag_seconds", "Age of the oldest unconfirmed event read from the slot.", registry=r
            )
            self.slot_wal_status = Gauge(
                "outbox_relay_slot_wal_status", "1 for the slot's wal_status (lost: invalidated), 0 for the others.",
                ["status"], registry=r,
            )  # fmt: skip
        self.slot_lag_bytes.set(-1 if lag_bytes is None else lag_bytes)
        self.slot_lag_seconds.set(lag_seconds or 0.0)
        for status in ("reserved", "extended", "unreserved", "lost", "missing"):
            self.slot_wal_status.labels(status).set(1 if (wal_status or "missing") == status else 0)

    def track_sinks(self, states: Callable[[], Mapping[str, bool]]) -> None:
        """Export ``outbox_relay_sink_up{sink}``, read from ``states`` at each scrape."""
        self.registry.register(_SinkStates(states))

    def observe_status(self, status: Status) -> None:
        """Copy a ``status`` reading into the gauges."""
        self.pending.set(status.pending)
        self.in_flight.set(status.in_flight)
        self.failed.set(status.failed)
        self.parked_keys.set(status.parked_keys)
        self.scheduled.set(status.scheduled)
        self.keys_waiting_on_schedule.set(status.keys_waiting_on_schedule)
        self.oldest_pending_age.set(status.oldest_pending_age_seconds)
        self.retrying.observe(status.retrying_topics)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)


class TopicCounter:
    """A counter labelled by topic with a bounded number of series.

    The first ``max_topics`` distinct topics keep a series each; every later one
    counts under ``topic="(other)"``, so topics that hold ids cannot grow
    ``/metrics`` without bound. The first topic folded is logged once.
    """

    def __init__(self, counter: Counter, max_topics: int) -> None:
        if max_topics < 0:
            raise ValueError("max_topics must not be negative")
        self._counter = counter
        self._max_topics = max_topics
        self._topics: set[str] = set()
        self._folded = False

    def labels(self, topic: str) -> Counter:
        """The series ``topic`` counts in."""
        if topic not in self._topics:
            if len(self._topics) >= self._max_topics:
                if not self._folded:
                    self._folded = True
                    logger.warning(
                        "more than %d topics: the rest are counted under topic=%s",
                        self._max_topics,
                        OTHER_TOPICS,
                        extra={"action": "metrics_topics_capped"},
                    )
                return self._counter.labels(OTHER_TOPICS)
            self._topics.add(topic)
        return self._counter.labels(topic)

    def collect(self) -> Iterable[Metric]:
        """The counter's samples, as ``Counter.collect`` gives them."""
        return self._counter.collect()


class RetryingTopics(Collector):
    """``outbox_relay_retrying{topic}`` and ``outbox_relay_oldest_retrying_age_seconds{topic}``: the
    events failing and retrying, not dead-lettered yet, as the last gauges reading found them.

    Only topics with retrying events have series, and at most ``max_topics``
    of them (those with the oldest events): the rest share ``topic="(other)"``
    (their sum, and the oldest age), as the per-topic counters do. A topic
    whose events stopped retrying has no series from the next reading on.
    """

    def __init__(self, max_topics: int) -> None:
        self._max_topics = max_topics
        self._series: dict[str, tuple[int, float]] = {}

    def observe(self, topics: Sequence[RetryingTopic]) -> None:
        """Replace the series with ``topics``."""
        ordered = sorted(topics, key=lambda t: (-t.oldest_age_seconds, t.topic))
        series = {t.topic: (t.retrying, t.oldest_age_seconds) for t in ordered[: self._max_topics]}
        rest = ordered[self._max_topics :]
        if rest:
            series[OTHER_TOPICS] = (sum(t.retrying for t in rest), max(t.oldest_age_seconds for t in rest))
        self._series = series

    def total(self) -> int:
        """Retrying events in every topic."""
        return sum(count for count, _ in self._series.values())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        count, age = self._families()
        for topic, (events, oldest) in self._series.items():
            count.add_metric([topic], float(events))
            age.add_metric([topic], oldest)
        yield count
        yield age

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "outbox_relay_retrying",
                "Events failing and retrying, not dead-lettered yet (pending with a failed attempt), by topic.",
                labels=["topic"],
            ),
            GaugeMetricFamily(
                "outbox_relay_oldest_retrying_age_seconds",
                "Age of the oldest retrying event of each topic, from its created_at.",
                labels=["topic"],
            ),
        )


class _SinkStates(Collector):
    """One gauge per routed sink: 1 while up, 0 while marked down."""

    def __init__(self, states: Callable[[], Mapping[str, bool]]) -> None:
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = self._family()
        for label, up in self._states().items():
            gauge.add_metric([label], 1.0 if up else 0.0)
        yield gauge

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "outbox_relay_sink_up", "1 while a routed sink is up, 0 while its events are held back.", labels=["sink"]
        )


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for every value, with one bucket search in C and one lock per bucket.

    The relay observes one latency per published event; at tens of thousands a
    second, ``observe``'s per-call Python loop and lock cost several percent of
    the relay's CPU. This reaches into prometheus_client's ``Histogram`` (its
    ``_upper_bounds``, ``_buckets`` and ``_sum``, unchanged since 0.4); a test
    checks it against ``observe``.
    """
    if not values:
        return
    ordered = sorted(values)
    counted = 0
    # observe() counts a value in the first bucket whose bound is >= it; the
    # last bound is +Inf, so every value lands somewhere.
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds, strict=True):
        upto = bisect_right(ordered, bound)
        if upto > counted:
            bucket.inc(upto - counted)
            counted = upto
    histogram._sum.inc(sum(ordered))
