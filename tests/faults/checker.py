"""A total-queue check: real writers, a real consumer, and a verdict by idempotency key.

Writers run business transactions through ``producers.publish`` (some rolled
back), each owning its keys so that a key's commit order is its write order.
A consumer collects everything the broker holds. The verdict counts:

- lost: committed, never delivered;
- leaked: rolled back, delivered;
- unexpected: delivered, never written;
- duplicates: deliveries beyond the first of an idempotency key;
- order violations: after dropping duplicates, a key's events out of write order.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import psycopg
from confluent_kafka import Consumer, Message, TopicPartition

import producers
from devservers import FIRST_OFFSET

#: How long the fresh read waits for a topic's first message, and for the next one after it, before it ends.
REREAD_FIRST_SECONDS = 10.0
REREAD_QUIET_SECONDS = 2.0

#: Every account a collector gave of events its live consumer missed, in order: a scenario's recorded result
#: carries those given while it ran (tests/faults/conftest.py), so that a miss the fresh read made good is on
#: record even when the scenario passes.
COLLECTOR_NOTES: list[str] = []


@dataclass
class Ledger:
    """What the writers did, by idempotency key."""

    committed: dict[str, tuple[str, int]] = field(default_factory=dict)
    rolled_back: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass(frozen=True)
class Delivery:
    """One message as the consumer saw it, in arrival order."""

    idempotency_key: str
    key: str | None
    seq: int


@dataclass(frozen=True)
class Verdict:
    """The counts of the check; ``ok`` when nothing was lost, leaked, invented or reordered."""

    committed: int
    rolled_back: int
    delivered: int
    lost: int
    leaked: int
    unexpected: int
    duplicates: int
    order_violations: int

    @property
    def ok(self) -> bool:
        return not (self.lost or self.leaked or self.unexpected or self.order_violations)

    def __str__(self) -> str:
        return (
            f"committed={self.committed} rolled_back={self.rolled_back} delivered={self.delivered} "
            f"lost={self.lost} leaked={self.leaked} unexpected={self.unexpected} "
            f"duplicates={self.duplicates} order_violations={self.order_violations}"
        )


class Writers:
    """``count`` writer threads, each with its own keys and connection.

    They write ``events`` in all, or go on past that until an event is set
    (``start(until=...)``; ``tests.faults.schedule`` does that for a fault schedule).
    """

    def __init__(
        self,
        database_url: str,
        topic: str,
        *,
        count: int = 8,
        events: int = 2000,
        keys_per_writer: int = 25,
        rollback_ratio: float = 0.3,
        events_per_transaction: int = 3,
        pause: float = 0.0,
        seed: int = 7,
        table: str = "outbox",
    ) -> None:
        self.ledger = Ledger()
        self.database_url = database_url
        self.topic = topic
        self.table = table
        self.rollback_ratio = rollback_ratio
        self.per_tx = events_per_transaction
        self.pause = pause
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._until: threading.Event | None = None
        self._commits = 0
        self._per_writer = events // count
        self._threads = [
            threading.Thread(target=self._write, args=(w, keys_per_writer, seed + w), daemon=True) for w in range(count)
        ]

    def start(self, *, until: threading.Event | None = None) -> Writers:
        """Start writing ``events`` in all; with ``until``, go on past that until it is set."""
        self._until = until
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop after the transaction in hand, quota or not."""
        self._stop.set()

    def committed(self) -> int:
        """Events the writer threads committed so far (not what a test added to the ledger itself)."""
        with self.ledger.lock:
            return self._commits

    def _more(self, written: int) -> bool:
        if self._stop.is_set():
            return False
        return written < self._per_writer or (self._until is not None and not self._until.is_set())

    def join(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            self._stop.set()
            raise TimeoutError("writers did not finish")
        if self.errors:
            raise self.errors[0]

    def _write(self, writer: int, keys: int, seed: int) -> None:
        rng = random.Random(seed)
        seqs = {f"w{writer}-k{k}": 0 for k in range(keys)}
        written = 0
        conn: psycopg.Connection[Any] | None = None
        try:
            while self._more(written):
                rollback = rng.random() < self.rollback_ratio
                batch: list[tuple[str, str, int]] = []
                left = self._per_writer - written
                for _ in range(min(self.per_tx, left) if left > 0 else self.per_tx):
                    key = rng.choice(list(seqs))
                    seq = seqs[key] + len([b for b in batch if b[1] == key]) + 1
                    batch.append((str(uuid.uuid4()), key, seq))
                conn = self._commit(conn, batch, rollback)
                with self.ledger.lock:
                    if rollback:
                        self.ledger.rolled_back.update(b[0] for b in batch)
                    else:
                        for idem, key, seq in batch:
                            self.ledger.committed[idem] = (key, seq)
                            seqs[key] = max(seqs[key], seq)
                        self._commits += len(batch)
                written += len(batch)
                if self.pause:
                    time.sleep(self.pause)
        except BaseException as exc:  # noqa: BLE001 - re-raised by join()
            self.errors.append(exc)
        finally:
            if conn is not None:
                conn.close()

    def _commit(
        self, conn: psycopg.Connection[Any] | None, batch: list[tuple[str, str, int]], rollback: bool
    ) -> psycopg.Connection[Any]:
        """Write ``batch`` in one transaction (rolled back if ``rollback``); the connection to use next."""
        if conn is None:
            conn = psycopg.connect(self.database_url)
        self._publish(conn, batch, rollback)
        return conn

    def _publish(self, conn: psycopg.Connection[Any], batch: list[tuple[str, str, int]], rollback: bool) -> None:
        with conn.transaction(force_rollback=rollback):
            for idem, key, seq in batch:
                producers.publish(
                    conn, self.topic, {"key": key, "seq": seq}, key=key, idempotency_key=idem, table=self.table
                )


class Watcher:
    """A daemon thread running :meth:`_run` for the length of a ``with`` block.

    ``_run`` loops until ``self._stop`` is set; leaving the block sets it and
    waits up to ``join_seconds`` for the thread.
    """

    join_seconds = 10.0

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.join_seconds)

    def _run(self) -> None:
        raise NotImplementedError


class KafkaCollector(Watcher):
    """Reads every partition of ``topic`` from the beginning in a thread."""

    join_seconds = 30.0

    def __init__(self, bootstrap: str, topic: str, partitions: int = 4) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.deliveries: list[Delivery] = []
        #: What the consumer itself ran into: its errors, and offsets it skipped or read twice.
        self.errors: Counter[str] = Counter()
        self.skipped: Counter[int] = Counter()
        self.reread = 0
        #: What :meth:`verdict` found when the live consumer missed events ("" if it did not).
        self.note = ""
        self._next: dict[int, int] = {}
        self._lock = threading.Lock()
        super().__init__()

    def troubles(self) -> str:
        """What the consumer ran into, for a failure message: a loss it explains is the harness's."""
        with self._lock:
            return (
                f"consumer errors {dict(self.errors) or 'none'}; offsets skipped per partition "
                f"{dict(self.skipped) or 'none'}; messages read twice {self.reread}"
            )

    def count(self) -> int:
        with self._lock:
            return len(self.deliveries)

    def wait_for(self, predicate: Callable[[list[Delivery]], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if predicate(self.deliveries):
                    return
            time.sleep(0.1)

    def _run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"faults-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "topic.metadata.refresh.interval.ms": 1000,
                # Should a fetch ever be answered "offset out of range", start the partition
                # over (the re-read is dropped below) rather than jump to its end past
                # messages not read yet: a loss must be the relay's, never the collector's.
                "auto.offset.reset": "earliest",
            }
        )
        try:
            while not self._stop.is_set():
                try:
                    meta = consumer.list_topics(self.topic, timeout=2).topics[self.topic]
                except Exception:  # noqa: BLE001 - the topic may not exist yet; retry
                    time.sleep(0.2)
                    continue
                if meta.partitions and not meta.error:
                    break
                time.sleep(0.2)
            consumer.assign([TopicPartition(self.topic, p, FIRST_OFFSET) for p in meta.partitions])
            while not self._stop.is_set():
                for message in consumer.consume(500, 0.1):
                    if message.error():
                        with self._lock:
                            self.errors[str(message.error())] += 1
                        continue
                    partition, offset = message.partition(), message.offset()
                    if partition is not None and offset is not None and not self._in_sequence(partition, offset):
                        continue
                    delivery = _delivery(message)
                    with self._lock:
                        self.deliveries.append(delivery)
        finally:
            consumer.close()

    def verdict(self, ledger: Ledger) -> Verdict:
        """The verdict on what the consumer read, a loss checked against a fresh read of the topic.

        A committed event the live consumer never saw, but that a fresh consumer
        reads from the broker, was the collector's miss, not the relay's: the
        verdict then stands on the fresh read. Either way the failure message
        (``note``) says how many the live consumer missed and what it ran into.
        """
        with self._lock:
            live = list(self.deliveries)
        result = verdict(ledger, live)
        if not result.lost:
            return result
        fresh = verdict(ledger, self.read_all())
        self.note = (
            f"the live consumer missed {result.lost}; a fresh read of the topic found {result.lost - fresh.lost} "
            f"of them in the broker; {self.troubles()}"
        )
        print(f"collector: {self.note}")
        COLLECTOR_NOTES.append(self.note)
        return fresh if fresh.lost < result.lost else result

    def read_all(self, timeout: float = 60.0) -> list[Delivery]:
        """Every message the broker holds for the topic now, read by a fresh consumer, partition by partition."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"faults-reread-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        found: list[Delivery] = []
        try:
            partitions = consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            # Tansu's high watermark is its last-written batch's first offset + 1 (devservers.tansu.FIRST_OFFSET):
            # no end past which a partition holds nothing more. The read ends once no message came for a while.
            consumer.assign([TopicPartition(self.topic, p, FIRST_OFFSET) for p in partitions])
            deadline = time.monotonic() + timeout
            quiet_until = time.monotonic() + REREAD_FIRST_SECONDS
            while time.monotonic() < min(deadline, quiet_until):
                for message in consumer.consume(500, 0.2):
                    quiet_until = time.monotonic() + REREAD_QUIET_SECONDS
                    if message.error() or message.partition() is None or message.offset() is None:
                        continue
                    found.append(_delivery(message))
        finally:
            consumer.close()
        return found

    def _in_sequence(self, partition: int, offset: int) -> bool:
        """Whether the message at ``offset`` is new: not one read before (after a reset), counting
        the offsets a jump passed over (a partition's offsets follow each other here)."""
        expected = self._next.get(partition, 0)
        with self._lock:
            if offset < expected:
                self.reread += 1
                return False
            if offset > expected:
                self.skipped[partition] += offset - expected
        self._next[partition] = offset + 1
        return True


def _delivery(message: Message) -> Delivery:
    """What the verdict needs of a Kafka message: its idempotency key, and the writer's key and sequence."""
    headers = dict(message.headers() or [])
    idem = headers.get("idempotency-key") or b""
    body = json.loads(message.value() or b"{}")
    return Delivery(idem.decode() if isinstance(idem, bytes) else idem, body.get("key"), int(body.get("seq", -1)))


def verdict(ledger: Ledger, deliveries: Iterable[Delivery]) -> Verdict:
    """Compare what was written with what arrived."""
    seen: Counter[str] = Counter()
    last_seq: dict[str, int] = {}
    violations = 0
    delivered = 0
    for d in deliveries:
        delivered += 1
        seen[d.idempotency_key] += 1
        if seen[d.idempotency_key] > 1 or d.key is None:
            continue
        if d.seq <= last_seq.get(d.key, 0):
            violations += 1
        last_seq[d.key] = max(d.seq, last_seq.get(d.key, 0))
    committed = set(ledger.committed)
    return Verdict(
        committed=len(committed),
        rolled_back=len(ledger.rolled_back),
        delivered=delivered,
        lost=len(committed - set(seen)),
        leaked=len(ledger.rolled_back & set(seen)),
        unexpected=len(set(seen) - committed - ledger.rolled_back),
        duplicates=sum(n - 1 for n in seen.values()),
        order_violations=violations,
    )
