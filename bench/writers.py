"""The application side: one-row business transactions, with and without ``producers.publish``.

``OpenLoopWriters`` offers a fixed rate by the wall clock (event ``i`` is due
at ``start + i / rate``, whatever happened to earlier ones), spread over
several connections, and records when each event's transaction committed.
``commit_costs`` measures what one connection can commit back to back.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import producers
from bench import stats
from bench.services import DISTINCT_KEYS, TABLE, document_for
from relay.config import TableName
from relay.store.migrate import migrate

BUSINESS_INSERT = "INSERT INTO business (customer, amount_cents) VALUES (%s, %s)"
#: Business transactions one writer connection is counted on for, when sizing the pool.
PER_CONNECTION_RATE = 50
MIN_CONNECTIONS = 2
MAX_CONNECTIONS = 24


def business_transaction(conn: psycopg.Connection[Any], i: int, topic: str | None, idempotency_key: str) -> None:
    """One order row and, when ``topic`` is given, its event; committed on return."""
    with conn.transaction():
        conn.execute(BUSINESS_INSERT, (f"customer-{i % 9973}", (i * 7919) % 100000))
        if topic is not None:
            producers.publish(
                conn, topic, document_for(i), key=f"order-{i % DISTINCT_KEYS}", idempotency_key=idempotency_key
            )


def connections_for(rate: float) -> int:
    """How many writer connections an offered ``rate`` needs, with headroom."""
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, math.ceil(2 * rate / PER_CONNECTION_RATE)))


class OpenLoopWriters:
    """Offer ``rate`` events per second for ``seconds``, by the clock, on ``connections`` threads."""

    def __init__(self, database_url: str, topic: str, rate: float, seconds: float, *, prefix: str) -> None:
        self.database_url = database_url
        self.topic = topic
        self.rate = rate
        self.seconds = seconds
        self.prefix = prefix
        self.connections = connections_for(rate)
        #: idempotency key -> monotonic time its transaction's COMMIT returned.
        self.committed_at: dict[str, float] = {}
        self.errors: list[str] = []
        self.max_lag_seconds = 0.0
        self.start_at = 0.0
        self.end_at = 0.0
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    @property
    def offered(self) -> int:
        return math.floor(self.rate * self.seconds)

    def start(self) -> None:
        """Open the connections, then start offering load a moment later."""
        conns = [psycopg.connect(self.database_url, autocommit=True) for _ in range(self.connections)]
        self.start_at = time.monotonic() + 0.2
        self.end_at = self.start_at + self.seconds
        for index, conn in enumerate(conns):
            thread = threading.Thread(target=self._write, args=(index, conn), name=f"writer-{index}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def join(self) -> None:
        """Wait for the last due event to be written."""
        for thread in self._threads:
            thread.join()

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def _write(self, index: int, conn: psycopg.Connection[Any]) -> None:
        committed: dict[str, float] = {}
        lag = 0.0
        try:
            for i in itertools.count(index, self.connections):
                due = self.start_at + i / self.rate
                if due >= self.end_at or self._stop.is_set():
                    break
                now = time.monotonic()
                if now >= self.end_at:
                    break  # behind schedule at the end: the rest were never offered
                if due > now:
                    time.sleep(due - now)
                else:
                    lag = max(lag, now - due)
                key = f"{self.prefix}-{i}"
                business_transaction(conn, i, self.topic, key)
                committed[key] = time.monotonic()
        except psycopg.Error as exc:
            with self._lock:
                self.errors.append(f"writer {index}: {exc}")
        finally:
            conn.close()
            with self._lock:
                self.committed_at.update(committed)
                self.max_lag_seconds = max(self.max_lag_seconds, lag)

    def summary(self) -> dict[str, Any]:
        return {
            "offered_rate": self.rate,
            "connections": self.connections,
            "committed": len(self.committed_at),
            "achieved_rate": len(self.committed_at) / self.seconds,
            "max_behind_schedule_ms": self.max_lag_seconds * 1000,
            "errors": self.errors[:5],
        }


QUIET_TABLE = TableName.parse("outbox_quiet")
# What publish() is measured against: the same columns into a plain table
# (a primary key, no other index or constraint), written by a bare INSERT.
PLAIN_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS plain_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic text, key text, payload jsonb, headers jsonb, idempotency_key text, deliver_at timestamptz, priority integer
)
"""
PLAIN_INSERT = (
    "INSERT INTO plain_events (topic, key, payload, headers, idempotency_key, deliver_at, priority)"
    " VALUES (%s, %s, %s, %s, %s, now(), 0)"
)
#: The slowest transactions of each kind left out of its mean: stalls of a shared machine.
TRIM_FRACTION = 0.01


def trimmed_mean(values: list[float], fraction: float = TRIM_FRACTION) -> float:
    """The mean of ``values`` without the largest ``fraction`` of them."""
    ordered = sorted(values)
    kept = ordered[: max(1, len(ordered) - int(len(ordered) * fraction))]
    return sum(kept) / len(kept) if kept else math.nan


def commit_costs(
    database_url: str, topic: str, *, seconds: float, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    """One connection, back-to-back business transactions of three kinds, interleaved.

    ``plain`` is the business row alone (L_commit); ``publish_notify`` adds
    ``producers.publish`` into the outbox with the NOTIFY trigger on,
    ``publish_no_notify`` into a second outbox table with it off, and
    ``bare_insert`` a bare second INSERT of the same columns into a plain
    table. Taking turns transaction by transaction puts the machine's slow
    moments on all four alike; each rate is one over the (1%-trimmed) mean
    duration.
    """
    migrate(database_url, TABLE, notify=True)
    migrate(database_url, QUIET_TABLE, notify=False)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(PLAIN_TABLE_SQL)
    kinds: dict[str, str | None] = {
        "plain": None,
        "publish_notify": str(TABLE),
        "publish_no_notify": str(QUIET_TABLE),
        "bare_insert": "plain_events",
    }
    durations: dict[str, list[float]] = {kind: [] for kind in kinds}
    order = list(kinds.items())
    with psycopg.connect(database_url, autocommit=True) as conn:
        started = time.perf_counter()
        next_report = started + 5
        i = 0
        while time.perf_counter() - started < seconds:
            order.append(order.pop(0))  # rotate, so no kind always follows another
            for kind, table in order:
                i += 1
                begun = time.perf_counter()
                with conn.transaction():
                    conn.execute(BUSINESS_INSERT, (f"customer-{i % 9973}", (i * 7919) % 100000))
                    if kind == "bare_insert":
                        conn.execute(
                            PLAIN_INSERT,
                            (topic, f"order-{i % DISTINCT_KEYS}", Jsonb(document_for(i)), Jsonb({}), str(uuid.uuid4())),
                        )
                    elif table is not None:
                        producers.publish(conn, topic, document_for(i), key=f"order-{i % DISTINCT_KEYS}", table=table)
                durations[kind].append(time.perf_counter() - begun)
            if time.perf_counter() >= next_report:
                next_report += 5
                progress(f"writer cost: {i:,} transactions")
    means = {kind: trimmed_mean(values) for kind, values in durations.items()}
    medians = {kind: stats.median(values) for kind, values in durations.items()}
    plain = means["plain"]
    return {
        "transactions": {kind: len(values) for kind, values in durations.items()},
        "rates": {kind: 1 / mean for kind, mean in means.items()},
        "median_ms": {kind: value * 1000 for kind, value in medians.items()},
        # Extra time per transaction: 0.10 means publish() made each one 10% slower.
        "publish_overhead_notify": means["publish_notify"] / plain - 1,
        "publish_overhead_no_notify": means["publish_no_notify"] / plain - 1,
        "bare_insert_overhead": means["bare_insert"] / plain - 1,
        # Issue 16's figure: what publish() adds to a transaction over what a bare INSERT adds.
        "publish_over_bare_insert": stats.ratio(means["publish_notify"] - plain, means["bare_insert"] - plain),
    }


def publish_cost_text(results: dict[str, Any]) -> str:
    """What ``producers.publish()`` adds to a transaction, against a bare INSERT of the same columns."""
    cost = results.get("writer_cost")
    if not cost or "bare_insert_overhead" not in cost:
        return "Not measured in this run: `python -m bench --only writer`."
    found = cost.get("publish_over_bare_insert")
    shown = f"{found:.2f}x" if isinstance(found, int | float) else "-"
    met = "-" if not isinstance(found, int | float) else ("yes" if found <= 1.5 else "**no**")
    return "\n".join(
        [
            "| Second statement of a one-row business transaction | Time added per transaction |",
            "| --- | --: |",
            f"| `producers.publish()` (NOTIFY on) | {cost['publish_overhead_notify']:+.0%} |",
            f"| `producers.publish()` (NOTIFY off) | {cost['publish_overhead_no_notify']:+.0%} |",
            f"| bare INSERT of the same columns into a plain table | {cost['bare_insert_overhead']:+.0%} |",
            "",
            f"`publish()` adds {shown} what the bare INSERT adds (target <= 1.5x: {met}).",
        ]
    )
