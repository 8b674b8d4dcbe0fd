"""The example shop behind ``python -m examples.demo``, and the books the demo checks.

Each order goes through three steps, each one transaction that changes the
order row and publishes an event with ``producers.publish`` (key = order id):
``order.created``, ``order.paid``, ``order.shipped``. A step fails now and
then after its event is written (out of stock, card declined, ...), which
rolls the transaction back, event included; the step is then retried. The
:class:`Ledger` remembers what was committed and what was rolled back, and
:class:`Deliveries` what came out of the broker, so :func:`summarize` can say
whether anything was lost, leaked or reordered. ``python -m examples.services
shop`` runs the same shop without an end, at a set rate (compose's ``shop``).
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

import producers

logger = logging.getLogger(__name__)

TOPIC = "shop.orders"
STEPS = ("order.created", "order.paid", "order.shipped")
# A step that fails this many times in a row leaves its order where it is.
MAX_TRIES_PER_STEP = 3
# Simulated work between two steps of one order, so the run lasts long
# enough to watch and the workers' transactions interleave.
THINK_SECONDS = 0.03

_CREATE_ORDERS = (
    "CREATE TABLE IF NOT EXISTS outbox_demo_orders ("
    " id text PRIMARY KEY, status text NOT NULL, total_cents integer NOT NULL,"
    " updated_at timestamptz NOT NULL DEFAULT now())"
)
_INSERT_ORDER = "INSERT INTO outbox_demo_orders (id, status, total_cents) VALUES (%s, 'created', %s)"
_UPDATE_ORDER = "UPDATE outbox_demo_orders SET status = %s, updated_at = now() WHERE id = %s"


class StepFailed(Exception):
    """The business reason a step's transaction is rolled back."""


class Books(Protocol):
    """Where the shop records what became of each event it wrote."""

    def committed(self, idempotency_key: str, order_id: str) -> None:
        """An event whose transaction has just committed."""
        ...

    def rolled(self, idempotency_key: str) -> None:
        """An event whose transaction was rolled back."""
        ...


class Ledger:
    """What the shop wrote: committed events (with commit time) and rolled-back ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.commit_time: dict[str, float] = {}
        self.rolled_back: set[str] = set()
        # Per order, its committed events in commit order: the order to expect downstream.
        self.sequence: dict[str, list[str]] = defaultdict(list)

    def committed(self, idempotency_key: str, order_id: str) -> None:
        """Record an event whose transaction has just committed."""
        now = time.monotonic()
        with self._lock:
            self.commit_time[idempotency_key] = now
            self.sequence[order_id].append(idempotency_key)

    def rolled(self, idempotency_key: str) -> None:
        """Record an event whose transaction was rolled back."""
        with self._lock:
            self.rolled_back.add(idempotency_key)

    def committed_keys(self) -> set[str]:
        """The idempotency keys committed so far."""
        with self._lock:
            return set(self.commit_time)

    def counts(self) -> tuple[int, int]:
        """``(committed, rolled back)`` so far."""
        with self._lock:
            return len(self.commit_time), len(self.rolled_back)


class Deliveries:
    """Messages the demo's consumer received, in arrival order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.received: list[tuple[str, str, float]] = []
        self.unreadable = 0

    def add(self, idempotency_key: str | None, payload: bytes | None) -> None:
        """Record one message by its ``idempotency-key`` header and the order id in its body."""
        now = time.monotonic()
        try:
            order_id = str(json.loads(payload or b"")["order_id"])
        except (ValueError, KeyError, TypeError):
            order_id = None
        with self._lock:
            if idempotency_key is None or order_id is None:
                self.unreadable += 1
            else:
                self.received.append((idempotency_key, order_id, now))

    def snapshot(self) -> list[tuple[str, str, float]]:
        """A copy of what arrived so far."""
        with self._lock:
            return list(self.received)


class Shop:
    """Places orders from ``workers`` threads, each with its own connection.

    ``orders`` orders in all, or orders until :meth:`stop` when it is None;
    with ``orders_per_second`` the workers together start no more orders a
    second than that.
    """

    def __init__(
        self,
        database_url: str,
        ledger: Books,
        *,
        orders: int | None,
        workers: int,
        failure_rate: float,
        table: str,
        topic: str = TOPIC,
        orders_per_second: float | None = None,
        seed: int | None = None,
    ) -> None:
        self.database_url = database_url
        self.ledger = ledger
        self.orders = orders
        self.workers = workers
        self.failure_rate = failure_rate
        self.table = table
        self.topic = topic
        self.orders_per_second = orders_per_second
        self._seed = random.randrange(2**32) if seed is None else seed
        # Order ids unique per run, so a shared database or broker never mixes runs.
        self._run = uuid.uuid4().hex[:6]
        self._lock = threading.Lock()
        self._placed = 0
        self._next_start = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []

    def prepare(self) -> None:
        """Create the shop's own table if missing."""
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            conn.execute(_CREATE_ORDERS)

    def start(self) -> None:
        """Start the workers; they stop when every order is placed or :meth:`stop` is called."""
        for index in range(self.workers):
            thread = threading.Thread(target=self._work, args=(index,), name=f"shop-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def done(self) -> bool:
        """True once every worker has finished; raises the first worker error, if any."""
        if self._errors:
            raise RuntimeError(f"a shop worker failed: {self._errors[0]!r}") from self._errors[0]
        return not any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """Ask the workers to finish the step in hand, and wait for them."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _work(self, index: int) -> None:
        rng = random.Random(self._seed + index)
        try:
            with psycopg.connect(self.database_url) as conn:
                while (order_id := self._next_order()) is not None:
                    self._order(conn, order_id, rng)
        except Exception as exc:  # noqa: BLE001 - handed to the main thread by done()
            self._errors.append(exc)

    def _next_order(self) -> str | None:
        """The next order's id once its start time has come; None when done or stopping."""
        with self._lock:
            if self._stop.is_set() or (self.orders is not None and self._placed >= self.orders):
                return None
            self._placed += 1
            number = self._placed
            start = time.monotonic()
            if self.orders_per_second:
                # No credit for idle time: a slow stretch is not followed by a burst.
                start = max(start, self._next_start)
                self._next_start = start + 1 / self.orders_per_second
        delay = start - time.monotonic()
        if delay > 0 and self._stop.wait(delay):
            return None
        return f"order-{self._run}-{number:04d}"

    def _order(self, conn: psycopg.Connection[Any], order_id: str, rng: random.Random) -> None:
        total_cents = rng.randrange(500, 50_000)
        for step in STEPS:
            for attempt in range(1, MAX_TRIES_PER_STEP + 1):
                if self._stop.is_set():
                    return
                time.sleep(rng.uniform(0, THINK_SECONDS))
                if self._step(conn, order_id, step, attempt, total_cents, rng):
                    break
            else:
                return

    def _step(
        self,
        conn: psycopg.Connection[Any],
        order_id: str,
        step: str,
        attempt: int,
        total_cents: int,
        rng: random.Random,
    ) -> bool:
        """One transaction: the order row and its event commit together or not at all."""
        payload = {"order_id": order_id, "type": step, "attempt": attempt, "total_cents": total_cents}
        idempotency_key = ""
        try:
            with conn.transaction():
                if step == "order.created":
                    conn.execute(_INSERT_ORDER, [order_id, total_cents])
                else:
                    conn.execute(_UPDATE_ORDER, [step.removeprefix("order."), order_id])
                idempotency_key = producers.publish(
                    conn, self.topic, payload, key=order_id, headers={"event-type": step}, table=self.table
                )
                # Fail after the event is written, so a leak would show.
                if rng.random() < self.failure_rate:
                    raise StepFailed(step)
        except StepFailed:
            self.ledger.rolled(idempotency_key)
            return False
        self.ledger.committed(idempotency_key, order_id)
        return True


@dataclass(frozen=True, slots=True)
class Report:
    """The demo's verdict."""

    committed: int
    rolled_back: int
    delivered: int
    duplicates: int
    leaked: int
    lost: int
    order_violations: int
    foreign: int
    unreadable: int
    latencies: list[float]

    @property
    def ok(self) -> bool:
        """True when nothing was lost, leaked or reordered."""
        return self.lost == 0 and self.leaked == 0 and self.order_violations == 0


def summarize(ledger: Ledger, deliveries: Deliveries) -> Report:
    """Compare what the shop committed with what the consumer received."""
    received = deliveries.snapshot()
    first_seen: dict[str, float] = {}
    duplicates = foreign = violations = 0
    position = {key: i for keys in ledger.sequence.values() for i, key in enumerate(keys)}
    last_position: dict[str, int] = {}
    for idempotency_key, order_id, at in received:
        if idempotency_key in first_seen:
            duplicates += 1
            continue
        if idempotency_key not in ledger.commit_time and idempotency_key not in ledger.rolled_back:
            foreign += 1  # from another run sharing the database or broker
            continue
        first_seen[idempotency_key] = at
        if idempotency_key in position:
            # Same key: each first arrival must come after the one before it.
            if position[idempotency_key] < last_position.get(order_id, -1):
                violations += 1
            last_position[order_id] = max(position[idempotency_key], last_position.get(order_id, -1))
    delivered = set(first_seen)
    committed = set(ledger.commit_time)
    latencies = sorted(first_seen[k] - ledger.commit_time[k] for k in delivered & committed)
    return Report(
        committed=len(committed),
        rolled_back=len(ledger.rolled_back),
        delivered=len(delivered),
        duplicates=duplicates,
        leaked=len(delivered & ledger.rolled_back),
        lost=len(committed - delivered),
        order_violations=violations,
        foreign=foreign,
        unreadable=deliveries.unreadable,
        latencies=latencies,
    )


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list; 0.0 when it is empty."""
    if not sorted_values:
        return 0.0
    rank = math.ceil(fraction * len(sorted_values)) - 1
    return sorted_values[max(0, min(rank, len(sorted_values) - 1))]
