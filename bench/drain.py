"""S1 (drain a backlog), S3 (does the drain slow down as it goes) and the relay's CPU and memory.

A copy of the seeded database holds N events; one relay process (or
``relays`` of them, started together) drains it while a consumer on the far
side of the broker timestamps what arrives. A drain given ``max_seconds``
stops there and is marked ``cut``: its rates are then taken over fractions
of what arrived by then, not of the backlog.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from bench import cpu, stats
from bench.consumers import KafkaReceiver, RabbitReceiver, Receiver
from bench.relayproc import RelayProcess
from bench.services import AMQP_URL, KAFKA_PARTITIONS, Cleanup

#: A drain that makes no progress for this long has stalled.
STALL_SECONDS = 60.0
MONITOR_SECONDS = 0.02


@dataclass
class Drain:
    """Where a drain runs: the seeded template, its topic (or queue) and the broker."""

    cleanup: Cleanup
    template: str
    topic: str
    events: int
    sink: str  # "kafka" or "rabbitmq"
    bootstrap: str | None = None
    progress: Callable[[str], None] = print
    partitions: int = KAFKA_PARTITIONS
    #: Stop the drain after this long (None: run until every event arrived).
    max_seconds: float | None = None
    #: The sink URL option format= (issue 18): native, cloudevents or cloudevents-structured.
    format: str = "native"
    #: How many relays drain it together (their CPU, claims and log lines are summed; RSS is the largest).
    relays: int = 1


def run_drain(drain: Drain, label: str, *extra: str) -> dict[str, Any]:
    """Drain a fresh copy of the template through one relay; rates, S3 ratio, CPU and memory.

    The topic (Kafka) or queue (RabbitMQ, bound by name on the default
    exchange) must exist and be empty.
    """
    cleanup = drain.cleanup
    url = cleanup.create_database(label, template=drain.template)
    receiver: Receiver
    if drain.sink == "kafka":
        assert drain.bootstrap is not None
        receiver = KafkaReceiver(drain.bootstrap, drain.topic, drain.partitions)
        sink_url = f"kafka://{drain.bootstrap}"
    else:
        receiver = RabbitReceiver(AMQP_URL, drain.topic)
        sink_url = AMQP_URL
    if drain.format != "native":
        sink_url += f"?format={drain.format}"
    receiver.start()
    receiver.ready.wait(30)
    try:
        result = _drain(drain, label, url, sink_url, receiver, extra)
    finally:
        receiver.stop()
        cleanup.drop_database(label)
    return result


def _drain(
    drain: Drain, label: str, url: str, sink_url: str, receiver: Receiver, extra: tuple[str, ...]
) -> dict[str, Any]:
    total = drain.events
    # The machine at 10% and 90% received, with the count then; each snapshot holds the relay's own CPU too.
    at: dict[float, tuple[cpu.Snapshot, int]] = {}
    started = time.monotonic()
    cut = False
    with contextlib.ExitStack() as stack:
        relays = [stack.enter_context(RelayProcess(url, sink_url, *extra)) for _ in range(drain.relays)]
        pids = [relay.pid for relay in relays]
        cpu_start = sum(relay.cpu_seconds() for relay in relays)
        last_count, last_change, next_report = 0, time.monotonic(), time.monotonic() + 2
        while receiver.count < total:
            if receiver.error is not None:
                raise RuntimeError(f"{receiver.name} failed: {receiver.error!r}")
            for relay in relays:
                relay.check_alive()
            now = time.monotonic()
            count = receiver.count
            for fraction in (0.1, 0.9):
                if fraction not in at and count >= fraction * total:
                    at[fraction] = (cpu.snapshot(pids), count)
            if count != last_count:
                last_count, last_change = count, now
            elif now - last_change > STALL_SECONDS:
                raise RuntimeError(f"{label}: no event received for {STALL_SECONDS:.0f}s at {count}/{total}")
            if drain.max_seconds is not None and now - started >= drain.max_seconds:
                cut = True
                drain.progress(f"{label}: cut after {drain.max_seconds:.0f}s at {count:,}/{total:,} received")
                break
            if now >= next_report:
                next_report = now + 2
                drain.progress(f"{label}: {count:,}/{total:,} received ({count / total:.0%})")
            time.sleep(MONITOR_SECONDS)
        finished = time.monotonic()
        at.setdefault(0.9, (cpu.snapshot(pids), receiver.count))
        cpu_total = sum(relay.cpu_seconds() for relay in relays) - cpu_start
        peak_rss = max(relay.peak_rss_bytes() for relay in relays)
        histograms = [relay.claim_histogram() for relay in relays]
        claim_sum, claim_count = sum(h[0] for h in histograms), sum(h[1] for h in histograms)
        warnings = sum(relay.warnings() for relay in relays)
        codes = [relay.stop() for relay in relays]
        code = next((c for c in codes if c), codes[0])
        for relay in relays:
            relay.discard_log()
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    marks = list(receiver.marks)
    # A cut drain's windows are fractions of what arrived before the cut.
    basis = stats.received_before(marks, finished) if cut else total
    rate = stats.window_rate(marks, basis, 0.1, 0.9)
    early = stats.window_rate(marks, basis, 0.1, 0.2)
    late = stats.window_rate(marks, basis, 0.8, 0.9)
    window_events = at[0.9][1] - at[0.1][1] if 0.1 in at else 0
    if window_events > 0:
        cpu_window = at[0.9][0].groups["relay"] - at[0.1][0].groups["relay"]
        machine_cpu = cpu.per_event(at[0.1][0], at[0.9][0], window_events)
    else:
        cpu_window, machine_cpu = math.nan, {}
    return {
        "events": total,
        "relays": drain.relays,
        "received": receiver.count,
        "cut": cut,
        "left_in_outbox": row[0] if row else None,
        "seconds": finished - started,
        "rate": rate,
        "rate_10_20": early,
        "rate_80_90": late,
        "s3_ratio": stats.ratio(late, early),
        "cpu_seconds_per_1000": cpu_window / window_events * 1000 if window_events > 0 else math.nan,
        "cpu_seconds_total": cpu_total,
        "cpu_share_of_one_core": cpu_window / (window_events / rate) if window_events > 0 and rate > 0 else None,
        "peak_rss_mb": peak_rss / 1024 / 1024,
        # The whole machine between 10% and 90% received, by group of processes.
        "machine_cpu": machine_cpu,
        "claim_mean_ms": claim_sum / claim_count * 1000 if claim_count else None,
        "claims": claim_count,
        "relay_log_lines": warnings,
        "relay_exit_code": code,
    }
