"""S2 (steady load: commit-to-ack latency) and S4 (the same load beside a long transaction).

Writers offer a fixed rate by the clock and note when each COMMIT returned.
The relay (:mod:`bench.acked_relay`) notes when the broker's acknowledgement
of each event reached it: commit-to-ack, the target's figure. A Kafka consumer
also timestamps each idempotency key: commit-to-consume adds the broker's
hand-over to a consumer and the consumer's fetch wait.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from bench import stats
from bench.consumers import KafkaReceiver
from bench.relayproc import RelayProcess
from bench.services import KAFKA_PARTITIONS, TABLE, Cleanup
from bench.writers import OpenLoopWriters
from relay.store.migrate import migrate

#: The first part of a run is left out of the latency figures (connections warming up).
WARMUP_FRACTION = 0.1
WARMUP_MIN_SECONDS = 1.0
#: How long to wait, after the writers stop, for the last events to arrive.
SETTLE_SECONDS = 60.0
#: S4 reads the claim histogram this often, and reports the mean of the last part separately.
CLAIM_SAMPLE_SECONDS = 5.0
CLAIM_TAIL_SECONDS = 10.0
#: Writer connections when measuring what the writers reach flat out.
CAPACITY_CONNECTIONS = 8
PUBLISH_HISTOGRAM = "outbox_relay_publish_latency_seconds"
DEAD_TUPLES_SQL = "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relname = 'outbox'"


@dataclass
class Steady:
    """Where steady runs happen: a template with a migrated, empty outbox, and the broker."""

    cleanup: Cleanup
    template: str
    bootstrap: str
    rate: float
    progress: Callable[[str], None] = print


@contextlib.contextmanager
def _stage(
    steady: Steady, label: str, *, notify: bool, listen: bool, note_acks: bool = False
) -> Iterator[tuple[str, str, KafkaReceiver, RelayProcess]]:
    """A fresh database and topic, a consumer and a relay, all removed afterwards."""
    cleanup = steady.cleanup
    url = cleanup.create_database(label, template=steady.template)
    migrate(url, TABLE, notify=notify)
    topic = cleanup.create_topic(label)
    receiver = KafkaReceiver(steady.bootstrap, topic, KAFKA_PARTITIONS, keys=True)
    receiver.start()
    receiver.ready.wait(30)
    extra = () if listen else ("--no-listen",)
    try:
        with RelayProcess(url, f"kafka://{steady.bootstrap}", *extra, note_acks=note_acks) as relay:
            yield url, topic, receiver, relay
            relay.discard_log()
    finally:
        receiver.stop()
        cleanup.drop_database(label)
        cleanup.delete_topic(topic)


def _await_all(
    steady: Steady, label: str, url: str, writers: OpenLoopWriters, receiver: KafkaReceiver
) -> dict[str, int]:
    """Wait for every committed event to arrive; then count what is missing, and where it is.

    ``lost`` is an event that committed, left the outbox (the broker
    acknowledged it) and never reached the consumer; ``undelivered`` is one
    still in the outbox when the wait ran out.
    """
    deadline = time.monotonic() + SETTLE_SECONDS
    missing = list(writers.committed_at)
    while True:
        missing = [key for key in missing if key not in receiver.received_at]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    still_there = 0
    if missing:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM outbox WHERE idempotency_key = ANY(%s)", [missing]).fetchone()
        still_there = row[0] if row else 0
        steady.progress(
            f"{label}: after {SETTLE_SECONDS:.0f}s, {len(missing):,} events not received, "
            f"{still_there:,} of them still in the outbox"
        )
    return {"not_received": len(missing), "lost": len(missing) - still_there, "undelivered": still_there}


def _latencies(
    writers: OpenLoopWriters,
    arrived_at: dict[str, float],
    since: float,
    until: float,
    *,
    left_at: dict[str, float] | None = None,
) -> list[float]:
    """For each event committed between ``since`` and ``until``: from its commit (or its
    time in ``left_at``, when given) to its time in ``arrived_at``."""
    start = writers.committed_at if left_at is None else left_at
    return [
        max(0.0, arrived_at[key] - start[key])
        for key, committed in writers.committed_at.items()
        if since <= committed < until and key in arrived_at and key in start
    ]


def _received_between(receiver: KafkaReceiver, since: float, until: float) -> int:
    return sum(1 for at in receiver.received_at.values() if since <= at < until)


def _report_while(steady: Steady, label: str, writers: OpenLoopWriters, receiver: KafkaReceiver) -> None:
    next_report = time.monotonic() + 2
    while writers.running():
        time.sleep(0.1)
        if time.monotonic() < next_report:
            continue
        next_report += 2
        steady.progress(
            f"{label}: {len(receiver.received_at):,} received, "
            f"{max(0.0, time.monotonic() - writers.start_at):.0f}/{writers.seconds:.0f}s"
        )


def run_steady(steady: Steady, label: str, seconds: float, *, notify: bool) -> dict[str, Any]:
    """S2: offer ``steady.rate`` for ``seconds``; latency percentiles, throughput and losses."""
    warmup = max(WARMUP_MIN_SECONDS, WARMUP_FRACTION * seconds)
    with _stage(steady, label, notify=notify, listen=notify, note_acks=True) as (url, topic, receiver, relay):
        writers = OpenLoopWriters(url, topic, steady.rate, seconds, prefix=label)
        writers.start()
        since, until = writers.start_at + warmup, writers.end_at
        _sleep_until(since)
        acks_start = stats.histogram_buckets(relay.metrics(), PUBLISH_HISTOGRAM)
        _report_while(steady, label, writers, receiver)
        writers.join()
        missing = _await_all(steady, label, url, writers, receiver)
        acks = stats.bucket_delta(stats.histogram_buckets(relay.metrics(), PUBLISH_HISTOGRAM), acks_start)
        relay.stop()
        stamps = relay.stamps()
    acked_at, claimed_at = stamps["acked"], stamps["claimed"]
    return {
        "notify": notify,
        "seconds": seconds,
        **writers.summary(),
        "received": len(receiver.received_at),
        **missing,
        "duplicates": receiver.duplicates,
        "throughput": _received_between(receiver, since, until) / (until - since),
        "latency": stats.latency_summary(_latencies(writers, receiver.received_at, since, until)),
        # The target's figure: from COMMIT returning in the writer to the
        # broker's acknowledgement reaching the relay.
        "ack_latency": stats.latency_summary(_latencies(writers, acked_at, since, until)),
        # Its two legs: the database's (COMMIT to the claim returning the event
        # to the relay) and the broker's (claim returned to ack), event by event.
        "claim_latency": stats.latency_summary(_latencies(writers, claimed_at, since, until)),
        "claim_to_ack": stats.latency_summary(_latencies(writers, acked_at, since, until, left_at=claimed_at)),
        # The relay's own view: from the row's created_at (the writer's transaction
        # start) to the broker's ack, read from its histogram's buckets.
        "insert_to_ack_p50_ms": stats.bucket_quantile(acks, 0.5) * 1000,
        "insert_to_ack_p99_ms": stats.bucket_quantile(acks, 0.99) * 1000,
    }


def run_long_transaction(steady: Steady, label: str, hold_seconds: float) -> dict[str, Any]:
    """S4: S2's load, then a REPEATABLE READ transaction that read the outbox, held ``hold_seconds``."""
    before_seconds = max(5.0, min(15.0, hold_seconds / 4))
    seconds = before_seconds + hold_seconds
    samples: list[tuple[float, tuple[float, float]]] = []
    with _stage(steady, label, notify=True, listen=True) as (url, topic, receiver, relay):
        writers = OpenLoopWriters(url, topic, steady.rate, seconds, prefix=label)
        writers.start()
        reporter = threading.Thread(target=_report_while, args=(steady, label, writers, receiver), daemon=True)
        reporter.start()
        warm = writers.start_at + max(WARMUP_MIN_SECONDS, WARMUP_FRACTION * before_seconds)
        _sleep_until(warm)
        claims_start = relay.claim_histogram()
        _sleep_until(writers.start_at + before_seconds)
        with psycopg.connect(url, autocommit=True) as holder, psycopg.connect(url, autocommit=True) as observer:
            dead_before = observer.execute(DEAD_TUPLES_SQL).fetchone()
            claims_open = relay.claim_histogram()
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM outbox").fetchone()
            opened = time.monotonic()
            steady.progress(f"{label}: long transaction open for {hold_seconds:.0f}s")
            while time.monotonic() < opened + hold_seconds:
                _sleep_until(min(opened + hold_seconds, time.monotonic() + CLAIM_SAMPLE_SECONDS))
                samples.append((time.monotonic(), relay.claim_histogram()))
            closed = time.monotonic()
            dead_during = observer.execute(DEAD_TUPLES_SQL).fetchone()
            holder.execute("ROLLBACK")
        writers.join()
        missing = _await_all(steady, label, url, writers, receiver)
    claims_close = samples[-1][1]
    before_claim = stats.mean_between(claims_start, claims_open)
    during_claim = stats.mean_between(claims_open, claims_close)
    tail = [reading for at, reading in samples if at <= closed - CLAIM_TAIL_SECONDS] or [claims_open]
    last_claim = stats.mean_between(tail[-1], claims_close)
    return {
        "hold_seconds": hold_seconds,
        **writers.summary(),
        "received": len(receiver.received_at),
        **missing,
        "duplicates": receiver.duplicates,
        "claim_mean_ms_before": before_claim * 1000,
        "claim_mean_ms_during": during_claim * 1000,
        "claim_mean_ms_last_10s": last_claim * 1000,
        "claim_ratio": stats.ratio(during_claim, before_claim),
        "claim_ratio_last_10s": stats.ratio(last_claim, before_claim),
        "throughput_before": _received_between(receiver, warm, opened) / (opened - warm),
        "throughput_during": _received_between(receiver, opened, closed) / (closed - opened),
        "latency_during": stats.latency_summary(_latencies(writers, receiver.received_at, opened, closed)),
        "n_dead_tup_before": dead_before[0] if dead_before else None,
        "n_dead_tup_during": dead_during[0] if dead_during else None,
    }


def _sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def writer_capacity(database_url: str, topic: str, seconds: float = 3.0) -> float:
    """Business transactions per second the writers reach flat out (no relay running)."""
    writers = OpenLoopWriters(database_url, topic, rate=1e9, seconds=seconds, prefix="capacity")
    writers.connections = CAPACITY_CONNECTIONS
    writers.start()
    writers.join()
    return len(writers.committed_at) / seconds
