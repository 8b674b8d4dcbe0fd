"""Key distributions (issue 16): how fast one relay drains a backlog, by how the backlog's keys are spread.

Each spread is a template database holding the same backlog written with COPY
(~150 bytes of JSON per event); each case drains a fresh copy of it through
one ``outbox-relay run`` at default settings, to Tansu (3 partitions) or to
RabbitMQ. L_db (on a copy of the 1,000-key template) and L_rmq (the same
payloads) are taken before and after the cases they are the denominators of.
A case still draining after ``cap_seconds`` is cut: its rates are those of
what arrived by then (see :mod:`bench.drain`). The figures go to
``results/keys.json`` too, which docs/performance.md renders.
"""

from __future__ import annotations

import base64
import json
import os
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench import baselines, lease_loop
from bench.consumers import RabbitReceiver
from bench.drain import Drain, run_drain
from bench.services import AMQP_URL, TABLE, document_for, require_rabbitmq, source_state
from relay.store.migrate import migrate

if TYPE_CHECKING:
    from bench.runner import Run

KEYS_PATH = Path(__file__).parent / "results" / "keys.json"
EVENTS = 200_000
#: The longest one case may drain; at the 7 events/s of one key before issue 16, 200,000 would take 8 hours.
CAP_SECONDS = 120.0
PARTITIONS = 3
COPY_SQL = "COPY outbox (topic, key, payload) FROM STDIN"


@dataclass(frozen=True)
class Spread:
    """How a backlog's keys are spread: ``keys`` None is null keys, 0 one key per event, n n keys.

    ``hot_every``: every so many events go to one more key, the hot one, the
    rest to the ``keys`` others. ``blob_bytes``: each payload carries that many
    more bytes of incompressible text, and the backlog is ``divisor`` times
    smaller, drained against ``baseline`` (L_db on a copy of the same backlog).
    ``relays``: how many relays drain it together; ``backlog``: the spread whose
    backlog (its template) this one drains, if not its own.
    """

    name: str
    label: str
    keys: int | None
    hot_every: int = 0
    blob_bytes: int = 0
    divisor: int = 1
    baseline: str = "l_db"
    relays: int = 1
    backlog: str | None = None

    def key(self, g: int) -> str | None:
        """The key of event ``g`` (from 1); keys take turns, so a key's events lie spread through the backlog."""
        if self.keys is None:
            return None
        if self.hot_every:
            if g % self.hot_every == 0:
                return "key-hot"
            g -= g // self.hot_every  # the others take turns over all the keys
        return f"key-{g if self.keys == 0 else g % self.keys}"

    def events(self, events: int) -> int:
        """How many events this spread's backlog holds when the others hold ``events``."""
        return max(1, events // self.divisor)

    def document(self, g: int) -> dict[str, Any]:
        """Event ``g``'s payload: :func:`document`, with ``blob_bytes`` more of base64 text."""
        found = document(g)
        if self.blob_bytes:
            # Random bytes, so that PostgreSQL's compression cannot shrink the row: the relay reads and sends it all.
            found["blob"] = base64.b64encode(random.Random(g).randbytes(self.blob_bytes * 3 // 4)).decode()
        return found


SPREADS = {
    spread.name: spread
    for spread in (
        Spread("null", "null keys", None),
        Spread("each", "one key per event", 0),
        Spread("k1000", "1,000 keys", 1000),
        # About as many keys as the default batch holds events: one event of each key in each batch.
        Spread("k4000", "4,000 keys", 4000),
        Spread("k8", "8 keys", 8),
        Spread("k1", "1 key", 1),
        Spread("hot", "1 hot key (half the events) and 1,000 others", 1000, hot_every=2),
        Spread("big", "1,000 keys, 16 KB payloads", 1000, blob_bytes=16_384, divisor=10, baseline="l_db_big"),
        # Relays started together: each claim meets keys another relay has in flight.
        Spread("k1000x3", "1,000 keys, 3 relays", 1000, relays=3, backlog="k1000"),
        Spread("hotx3", "1 hot key and 1,000 others, 3 relays", 1000, hot_every=2, relays=3, backlog="hot"),
    )
}
KAFKA_CASES = ("null", "each", "k1000", "k4000", "k8", "k1", "hot", "big", "k1000x3", "hotx3")
RABBIT_CASES = ("k1000", "k1")
SINK_LABELS = {"kafka": "Kafka", "rabbitmq": "RabbitMQ"}
#: Issue 16's targets: (sink, spread) -> (least drain rate over the baseline, the baseline).
TARGETS: dict[tuple[str, str], tuple[float, str]] = {
    ("kafka", "k1000"): (0.9, "l_db"),
    ("kafka", "k8"): (0.8, "l_db"),
    ("kafka", "k1"): (0.5, "l_db"),
    ("rabbitmq", "k1000"): (0.9, "l_rmq"),
    ("rabbitmq", "k1"): (0.3, "l_rmq"),
}
#: "No worse than today's": the ratios to L_db before issue 16's redesign (9380a59), the lower of two
#: runs on 2026-12-01 with the machine loaded by other work (0.98 and 1.06; 1.04 and 1.56).
BEFORE: dict[tuple[str, str], tuple[float, str]] = {
    ("kafka", "null"): (0.98, "l_db"),
    ("kafka", "each"): (1.04, "l_db"),
}
#: L_rmq,1 publishes at most this many events: one round trip each, a few thousand a second.
SERIAL_EVENTS = 20_000
#: The drain rate at 80-90% received over the rate at 10-20%, in every case.
LATE_OVER_EARLY = 0.9


def document(g: int) -> dict[str, Any]:
    """Event ``g``'s payload: ~150 bytes of JSON (the seeded payload without its timestamp and status)."""
    payload = document_for(g)
    del payload["created_at"], payload["status"]
    return payload


def payload(g: int) -> bytes:
    """:func:`document` as JSON bytes, for L_rmq."""
    return json.dumps(document(g)).encode()


def l_rmq(url: str, queue: str, events: int) -> dict[str, Any]:
    """L_rmq with this scenario's payloads (a module function, so a child process can run it)."""
    return baselines.l_rmq(url, queue, events, payload=payload)


def l_rmq_serial(url: str, queue: str, events: int) -> dict[str, Any]:
    """L_rmq with one unconfirmed message at a time: the ceiling of any publisher that keeps
    a key's order the way the relay does on RabbitMQ (a module function, for a child process)."""
    return baselines.l_rmq(url, queue, events, window=1, payload=payload)


def seed(url: str, spread: Spread, topic: str, events: int) -> None:
    """Migrate, COPY ``events`` events with ``spread``'s keys into the outbox, VACUUM ANALYZE."""
    migrate(url, TABLE)
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.cursor().copy(COPY_SQL) as copy:
            for g in range(1, spread.events(events) + 1):
                copy.write_row((topic, spread.key(g), json.dumps(spread.document(g))))
        conn.execute("VACUUM (ANALYZE) outbox")


class KeysScenario:
    """One run of every case, its templates and its baselines; the figures land in ``run.results["keys"]``."""

    def __init__(self, run: Run, *, events: int, cap_seconds: float) -> None:
        self.run = run
        self.events = events
        self.cap_seconds = cap_seconds
        self.templates: set[str] = set()
        self.data: dict[str, Any] = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "source": source_state(),
            "events": events,
            "cap_seconds": cap_seconds,
            "partitions": PARTITIONS,
            "payload_bytes": round(sum(len(payload(g)) for g in range(1, 1001)) / 1000),
            # Other work on the machine moves every figure; a reader should know how busy it was.
            "load_average": {"start": os.getloadavg()[0]},
            "baselines": {},
            "cases": {},
        }
        run.results["keys"] = self.data

    def template(self, spread: Spread) -> str:
        """The template database of ``spread``'s backlog, seeded on first use."""
        if spread.backlog is not None:
            return self.template(SPREADS[spread.backlog])
        name = f"keys_{spread.name}"
        if name not in self.templates:
            started = time.monotonic()
            self.run.progress(f"seeding {name}: {spread.events(self.events):,} events over {spread.label}, with COPY")
            url = self.run.cleanup.create_database(name)
            seed(url, spread, self.topic(spread), self.events)
            self.run.progress(f"seeded {name} in {time.monotonic() - started:.1f}s")
            self.templates.add(name)
        return name

    def topic(self, spread: Spread) -> str:
        return self.run.cleanup.topic_name(f"keys-{spread.name}")

    def _bracket(self, name: str, result: dict[str, Any]) -> None:
        entry = self.data["baselines"].setdefault(name, {"runs": []})
        entry["runs"].append(result)
        entry["rate"] = sum(r["rate"] for r in entry["runs"]) / len(entry["runs"])
        self.run.progress(f"keys {name}: {result['rate']:,.0f} events/s (mean so far {entry['rate']:,.0f})")

    def l_db(self, spread: str = "k1000") -> None:
        """L_db on a copy of ``spread``'s backlog, recorded under its spread's baseline (l_db, l_db_big)."""
        chosen = SPREADS[spread]
        url = self.run.cleanup.create_database("keys_ldb", template=self.template(chosen))
        try:
            result = baselines.l_db(url, chosen.events(self.events))
        finally:
            self.run.cleanup.drop_database("keys_ldb")
        self._bracket(chosen.baseline, result)

    def l_lease(self) -> None:
        """L_lease (bench/lease_loop.py) on a copy of the 1,000-key backlog: the database work of a relay leasing
        each row, and nothing else."""
        chosen = SPREADS["k1000"]
        url = self.run.cleanup.create_database("keys_llease", template=self.template(chosen))
        try:
            result = lease_loop.l_lease(url)
        finally:
            self.run.cleanup.drop_database("keys_llease")
        self._bracket("l_lease", result)

    def l_lease_kafka(self) -> None:
        """L_lease,kafka (bench/lease_loop.py) on a copy of the 1,000-key backlog, to Tansu."""
        chosen = SPREADS["k1000"]
        bootstrap = self.run.bootstrap
        name = self.run.cleanup.create_topic(f"keys-{chosen.name}", PARTITIONS)
        url = self.run.cleanup.create_database("keys_lleasek", template=self.template(chosen))
        try:
            result = lease_loop.l_lease_kafka(url, bootstrap)
        finally:
            self.run.cleanup.drop_database("keys_lleasek")
            self.run.cleanup.delete_topic(name)
        self._bracket("l_lease_kafka", result)

    def l_rmq(self) -> None:
        require_rabbitmq()
        queue = self.run.cleanup.create_queue("keys-lrmq")
        try:
            result = self.run.received_baseline(
                RabbitReceiver(AMQP_URL, queue), l_rmq, AMQP_URL, queue, events=self.events
            )
        finally:
            self.run.cleanup.delete_queue(queue)
        self._bracket("l_rmq", result)

    def l_rmq_serial(self) -> None:
        require_rabbitmq()
        queue = self.run.cleanup.create_queue("keys-lrmq1")
        events = min(self.events, SERIAL_EVENTS)
        try:
            result = self.run.received_baseline(
                RabbitReceiver(AMQP_URL, queue), l_rmq_serial, AMQP_URL, queue, events=events
            )
        finally:
            self.run.cleanup.delete_queue(queue)
        self._bracket("l_rmq_serial", result)

    def drain(self, sink: str, spread: Spread) -> None:
        """Drain a copy of ``spread``'s template to ``sink``; record it as ``<sink>/<spread>``."""
        template = self.template(spread)
        cleanup = self.run.cleanup
        kafka = sink == "kafka"
        bootstrap = self.run.bootstrap if kafka else None  # starts Tansu on first use
        topic = f"keys-{spread.backlog or spread.name}"  # the topic its backlog's events name
        name = cleanup.create_topic(topic, PARTITIONS) if kafka else cleanup.create_queue(topic)
        drain = Drain(
            cleanup,
            template,
            name,
            spread.events(self.events),
            sink,
            bootstrap,
            self.run.progress,
            partitions=PARTITIONS,
            max_seconds=self.cap_seconds,
            relays=spread.relays,
        )
        try:
            result = run_drain(drain, f"keys_{sink}_{spread.name}")
        finally:
            (cleanup.delete_topic if kafka else cleanup.delete_queue)(name)
        self.data["cases"][f"{sink}/{spread.name}"] = {"sink": sink, "spread": spread.name, **result}
        cut = f", cut at {result['received']:,}" if result["cut"] else ""
        self.run.progress(f"keys {sink} {spread.label}: {result['rate']:,.1f} events/s{cut}")
        self.run.save()

    def measure(self) -> None:
        """Seed, then L_db (of the ~150-byte and the 16 KB backlogs), L_lease and L_lease,kafka, the Kafka
        cases, those again, L_rmq and L_rmq,1, the RabbitMQ cases, L_rmq,1 and L_rmq; then write keys.json."""
        for spread in SPREADS.values():  # all before measuring: seeding's writes would land in a measurement
            self.template(spread)
        self.l_db()
        self.l_lease()
        self.l_lease_kafka()
        self.l_db("big")
        for name in KAFKA_CASES:
            self.drain("kafka", SPREADS[name])
        self.l_db("big")
        self.l_lease_kafka()
        self.l_lease()
        self.l_db()
        self.l_rmq()
        self.l_rmq_serial()
        for name in RABBIT_CASES:
            self.drain("rabbitmq", SPREADS[name])
        self.l_rmq_serial()
        self.l_rmq()
        self.data["load_average"]["end"] = os.getloadavg()[0]
        KEYS_PATH.parent.mkdir(parents=True, exist_ok=True)
        KEYS_PATH.write_text(json.dumps(self.data, indent=2, default=str) + "\n")


def measure(run: Run, *, events: int = EVENTS, cap_seconds: float = CAP_SECONDS) -> None:
    """Every key-distribution case with its baselines, into ``run.results["keys"]`` and keys.json."""
    KeysScenario(run, events=events, cap_seconds=cap_seconds).measure()
