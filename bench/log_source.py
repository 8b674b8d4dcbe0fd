"""The log source (issue 38) against the table source and L_db, in one run on one embedded PostgreSQL 18
with ``wal_level=logical``. Ratios of the same run: the machine is shared, its absolute figures are noisy.

python -m bench.log_source                      # 200,000 events, ~8-10 minutes (the drains ~6 to Kafka)
python -m bench.log_source --events 50000       # a quick look
python -m bench.log_source --kafka              # the drains to Kafka (Tansu) instead of an in-memory sink
python -m bench.log_source --rounds 5           # each spread's log and table drains 5 times (3 by default)

Measured, each to an acknowledging in-memory sink (the relay's own cost, no broker):
- drain of a backlog in the slot (streaming) vs the table source's drain of the same rows vs L_db, for
  each spread of keys (null keys, one key per event, 1,000 keys, 1 key), in ``--rounds`` interleaved rounds
  (each on freshly seeded databases, log or table first by turns): the median rate of each, and the median
  and range of the rounds' log / table ratios with the verdict on issue 38's ">= 2 x the table source's";
- L_log, the floor of the log's side: a bare loop that reads the slot's stream as the relay does (every
  frame one wait on the socket brought) and counts the inserts (no parsing, no events, no sink); with
  ``--kafka`` also L_kafka, the bare producer loop, and L_log_kafka, the two joined: the bare stream read
  producing each insert's payload bytes (and key) to Kafka with the relay's producer settings, no event
  built, until every delivery is reported. L_log_kafka is what one Python process does here at all: the
  floor of both issue 38 targets (drain >= 1.5 x L_db, CPU <= 0.5 x the table source's);
- with ``--kafka``, the same events written by table-less writers (``pg_logical_emit_message(true, 'outbox',
  envelope)`` from SQL, in transactions of 20,000): the log relay's drain of them, each spread, over L_db and
  over L_log_kafka_messages, their floor (the bare stream read producing each message's payload with its key
  and idempotency-key header, the envelope parsed by plain ``json.loads``; nothing to delete);
- the relay's own latency at 500 events/s: a writer's COMMIT to the event handed to the sink, p50/p99, over
  the raw client's (the same writer, a bare loop reading the inserts' frames off the stream);
- the server's decoding alone through ``pg_logical_slot_peek_binary_changes`` (the polling design's floor);
- relay CPU per 1,000 events, log vs table;
- WAL bytes per event: the writer (one event per transaction: a row, a message, a bare jsonb INSERT) and
  the relay's own share (table source: claim, lease, delete; log source: the delete after the acknowledgement);
- the commit cost of ``publish(..., via="message")`` vs a bare jsonb INSERT;
- peak memory of a log relay draining one 100,000-event transaction (a subprocess of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import queue
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from confluent_kafka import Producer

import producers
from bench import stats
from bench.baselines import l_db, l_kafka
from bench.services import DISTINCT_KEYS, EVENTS_SQL, SEED_SQL
from devservers import Tansu
from devservers.postgres import LOGICAL_DECODING, embedded_postgres
from relay.app import tune_collector
from relay.config import PUBLISH_TIMEOUT_SECONDS, KafkaSinkConfig, RelaySettings, TableName, parse_sink_url
from relay.events import IDEMPOTENCY_HEADER, Event, Outcome
from relay.holds import KeyHolds
from relay.log_relay import LogRelay
from relay.loop import Relay
from relay.sinks import build_sink
from relay.sinks.base import Sink
from relay.sinks.kafka import producer_config
from relay.sinks.memory import MemorySink
from relay.sources.log import pgoutput
from relay.sources.log.pgoutput import INSERT, XLOG_DATA, XLOG_HEADER, pick_columns
from relay.sources.log.publication import prepare, publication_name
from relay.sources.log.stream import ReplicationStream
from relay.store.adapters import build_store
from relay.store.migrate import migrate

TABLE = TableName.parse("outbox")
#: The spreads of keys each drain is measured on: name -> keys (0: null keys; None: one key per event).
SPREADS: dict[str, int | None] = {"null keys": 0, "one key per event": None, "1,000 keys": 1000, "1 key": 1}
LATENCY_RATE = 500.0
#: The writers' ways of writing one event per transaction, and their rounds (see _writer_costs).
BARE = "bare jsonb INSERT"
MESSAGE = "publish(via='message')"
WRITER_ROUND = 100
WRITER_WARM_UP = 10
#: pgoutput's relation message ('R'): L_log_kafka finds the key and payload columns by name in it.
_RELATION = 0x52
#: pgoutput's logical message ('M'): L_log_kafka_messages reads its envelope.
_MESSAGE = 0x4D
#: The seeded events of ``_seed`` as table-less writers write them: one ``outbox`` message each, its envelope
#: the one ``producers.publish(..., via="message")`` writes (an idempotency key of its own, no headers).
SEED_MESSAGES_SQL = (
    "SELECT count(pg_logical_emit_message(true, 'outbox', jsonb_build_object('topic', topic, 'key', key,"
    " 'payload', payload, 'idempotency_key', gen_random_uuid()::text)::text)) FROM (" + EVENTS_SQL + ") AS e"
)
#: Issue 38's targets: a drain to Kafka at this many x L_db at least, the relay's CPU at this share of the
#: table source's at most.
TARGET_X_L_DB = 1.5
TARGET_CPU_SHARE = 0.5
#: Issue 38's target for every spread: the log relay's drain at this many x the table source's at least.
TARGET_X_TABLE = 2.0
#: Rounds of each spread's log and table drains (``--rounds``): one drain of each swings too much between
#: runs of the shared machine for a verdict; each round seeds both afresh, and the first to drain alternates.
DRAIN_ROUNDS = 3
#: A slot for each floor and drain of one run (their slots stay, inactive, until the server goes).
BENCH_SLOTS = {**LOGICAL_DECODING, "max_replication_slots": "24", "max_wal_senders": "24"}


def _url(server: str, name: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(server)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})


def _database(server: str, name: str, *, slot: bool) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = _url(server, name)
    migrate(url, TABLE)
    if slot:
        prepare(url, TABLE, name)
    return url


def _drop(server: str, name: str) -> None:
    """Drop database ``name`` and its slots, once a drain is done with them (a run seeds many: their slots
    would hold the WAL and the slots run out). A slot its relay just let go may still show active a moment."""
    with psycopg.connect(server, autocommit=True) as conn:
        for _ in range(50):
            try:
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s", [name]
                )
                break
            except psycopg.errors.ObjectInUse:
                time.sleep(0.1)
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def _drain_pair(
    server: str, name: str, events: int, keys: int | None, kafka: str | None, *, log_first: bool
) -> dict[str, dict[str, float]]:
    """One round of a spread: ``events`` seeded afresh for each source, the log relay's drain and the table
    source's (``log_first`` or the other way round), their databases dropped afterwards."""
    log_url = _database(server, f"log_drain_{name}", slot=True)
    _seed(log_url, events, keys)
    table_url = _database(server, f"table_drain_{name}", slot=False)
    _seed(table_url, events, keys)
    drains = {
        "log": lambda: asyncio.run(_drain_log(log_url, events, kafka)),
        "table": lambda: asyncio.run(_drain_table(table_url, events, kafka)),
    }
    order = ["log", "table"] if log_first else ["table", "log"]
    pair = {source: drains[source]() for source in order}
    _drop(server, f"log_drain_{name}")
    _drop(server, f"table_drain_{name}")
    return {"log": pair["log"], "table": pair["table"]}


def _rounds_summary(pairs: Sequence[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """A spread's rounds: ``log`` and ``table`` the median of each figure over the rounds, ``log_over_table``
    the median and range of the rounds' ratios of the log's rate to the table's (each round's two drains ran
    side by side, so their ratio carries less of the machine's swings than the medians' ratio), ``rounds``
    each round's pair."""
    ratios = [pair["log"]["rate"] / pair["table"]["rate"] for pair in pairs]
    return {
        "log": {field: stats.median([p["log"][field] for p in pairs]) for field in pairs[0]["log"]},
        "table": {field: stats.median([p["table"][field] for p in pairs]) for field in pairs[0]["table"]},
        "log_over_table": {"median": stats.median(ratios), "min": min(ratios), "max": max(ratios)},
        "rounds": list(pairs),
    }


def _drain_verdict(ratio: dict[str, float]) -> str:
    """Issue 38's ">= 2 x the table source's drain" for one spread, from its rounds' ratios: met when their
    median is, and whether every round's was, or none's."""
    low, median, high = ratio["min"], ratio["median"], ratio["max"]
    if low >= TARGET_X_TABLE:
        return f"met (every round >= {TARGET_X_TABLE:g} x)"
    if median >= TARGET_X_TABLE:
        return f"met by the median (the least round {low:.2f} x)"
    if high >= TARGET_X_TABLE:
        return f"not met by the median (the best round {high:.2f} x)"
    return f"not met (no round >= {TARGET_X_TABLE:g} x)"


def _lsn(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return _lsn_on(conn)


def _lsn_on(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def _seed(url: str, events: int, keys: int | None = DISTINCT_KEYS) -> None:
    """``events`` rows in transactions of 20,000, over ``keys`` keys (0: null keys; None: one key per event)."""
    with psycopg.connect(url, autocommit=True) as conn:
        step = 20_000
        for first in range(0, events, step):
            # generate_series restarts at 1 in each step: with one key per event, the key counts on from first.
            spread = keys if keys is not None else events * 2
            sql = SEED_SQL.format(keys=spread).replace("(g %% ", f"((g + {first}) %% ", 1)
            conn.execute(sql, {"topic": "bench", "keyed": keys != 0, "n": min(step, events - first)})


def _seed_messages(url: str, events: int, keys: int | None = DISTINCT_KEYS, topic: str = "bench") -> None:
    """``_seed``'s events as ``outbox`` messages (no rows) to ``topic``, in transactions of 20,000."""
    with psycopg.connect(url, autocommit=True) as conn:
        step = 20_000
        for first in range(0, events, step):
            spread = keys if keys is not None else events * 2
            sql = SEED_MESSAGES_SQL.format(keys=spread).replace("(g %% ", f"((g + {first}) %% ", 1)
            conn.execute(sql, {"topic": topic, "keyed": keys != 0, "n": min(step, events - first)})


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _settings() -> RelaySettings:
    return RelaySettings(batch_size=1000, publish_timeout_seconds=30.0)


def _sink(kafka: str | None) -> Sink:
    if kafka is None:
        return MemorySink()
    return build_sink(parse_sink_url(f"kafka://{kafka}"), publish_timeout_seconds=30.0)


def _published(relay: LogRelay | Relay, sink: Sink, topic: str = "bench") -> int:
    if isinstance(sink, MemorySink):
        return len(sink.delivered)
    # One counter read, not a collect of the whole registry: the drains poll this every 10 ms.
    return int(relay.metrics.published.labels(topic)._value.get())


async def _drain_log(
    url: str, events: int, kafka: str | None = None, *, rows: bool = True, topic: str = "bench"
) -> dict[str, float]:
    """The log relay's drain of ``events`` to ``topic`` in the slot: rows (deleted once confirmed: their WAL
    counted) or, with ``rows=False``, messages (nothing to delete: the WAL of the confirms only)."""
    sink = _sink(kafka)
    slot = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    relay = LogRelay(url, TABLE, slot, sink, _settings())
    stop = asyncio.Event()
    wal = _lsn(url)
    cpu, started = _cpu(), time.perf_counter()
    task = asyncio.create_task(relay.run(stop))
    while _published(relay, sink, topic) < events:
        await asyncio.sleep(0.01)
        if task.done():
            task.result()
    elapsed = time.perf_counter() - started
    spent = _cpu() - cpu
    while rows:  # its share of WAL: the deletes of the delivered rows, once confirmed
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM outbox").fetchone()
        if row is not None and row[0] == 0:
            break
        await asyncio.sleep(0.1)
    wal = _lsn(url) - wal
    stop.set()
    await task
    return {"seconds": elapsed, "rate": events / elapsed, "cpu_per_1000": spent / events * 1000, "wal": wal / events}


async def _drain_table(url: str, events: int, kafka: str | None = None) -> dict[str, float]:
    sink = _sink(kafka)
    settings = _settings()
    store = build_store(url, TABLE, owner="bench", lease_seconds=settings.lease_seconds, keep_sent=False, listen=True)
    relay = Relay(store, sink, settings)
    stop = asyncio.Event()
    wal = _lsn(url)
    cpu, started = _cpu(), time.perf_counter()
    task = asyncio.create_task(relay.run(stop))
    while _published(relay, sink) < events:
        await asyncio.sleep(0.01)
        if task.done():
            task.result()
    elapsed = time.perf_counter() - started
    spent = _cpu() - cpu
    stop.set()
    await task
    wal = _lsn(url) - wal
    return {"seconds": elapsed, "rate": events / elapsed, "cpu_per_1000": spent / events * 1000, "wal": wal / events}


def _slot_stream(url: str) -> ReplicationStream:
    """The stream of the slot a floor's database has (named after the database, as its publication)."""
    slot = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    return ReplicationStream(url, slot, publication_name(slot), sender_timeout_seconds=60.0)


def _floor_producer(kafka: str) -> tuple[dict[str, Any], dict[str, int], Callable[[Any, Any], None]]:
    """A Kafka floor's producer settings (the relay's), its delivery reports' counts, and the callback that
    counts them."""
    settings = producer_config(
        KafkaSinkConfig(bootstrap_servers=kafka), publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS, client_id="floor"
    )
    report = {"acked": 0, "failed": 0}

    def delivered(error: Any, _message: Any) -> None:
        report["failed" if error is not None else "acked"] += 1

    return settings, report, delivered


async def _l_log(url: str, events: int) -> dict[str, float]:
    """The bare loop on the log's side: read the slot's stream until ``events`` inserts came; nothing else."""
    stream = _slot_stream(url)
    cpu, started = _cpu(), time.perf_counter()
    await stream.start(10.0)
    seen = 0
    while seen < events:  # as the relay reads: every frame one wait on the socket brought, in one list
        for frame in await stream.read_frames(5.0, 10_000):
            if frame[0] == XLOG_DATA and frame[XLOG_HEADER] == INSERT:
                seen += 1
    elapsed = time.perf_counter() - started
    spent = _cpu() - cpu
    await stream.close()
    return {"seconds": elapsed, "rate": events / elapsed, "cpu_per_1000": spent / events * 1000}


async def _l_log_kafka(
    url: str, kafka: str, events: int, *, headers: bool = False, deletes: bool = False, topic: str = "bench-log-floor"
) -> dict[str, float]:
    """L_log's loop producing each insert's payload bytes (its key too) to Kafka with the relay's producer
    settings, until every delivery is reported: no event, no batch, no judge. The columns are found by name
    once (the relation message); each insert is picked in one pass (:func:`pgoutput.pick_columns`), as the
    relay's reader does. Process CPU, as the relay's: librdkafka's threads count.

    What the contract asks of any relay of table rows for each event, in the least Python: ``headers``
    (L_log_kafka_headers) adds the ``idempotency-key`` header; ``deletes`` (L_log_kafka_contract, with the
    header) also deletes the delivered rows (the table must not grow), a read's ids at a time once as many
    deliveries were reported, by one ``DELETE ... WHERE id = ANY(...)`` on a thread of its own (as the relay's
    bulk delete runs beside its reader). The deletes count acknowledgements, not which ones: a floor aborts
    on any failure anyway."""
    contract = headers or deletes
    stream = _slot_stream(url)
    settings, report, delivered = _floor_producer(kafka)
    wanted = ("key", "payload", "id", "idempotency_key") if contract else ("key", "payload")
    to_delete: queue.SimpleQueue[list[bytes] | None] = queue.SimpleQueue()
    deleter = threading.Thread(target=_delete_rows, args=(url, to_delete), daemon=True)
    unsent: list[tuple[int, list[bytes]]] = []  # each read's ids, and the deliveries reported once all were
    places: tuple[int, ...] = ()
    cpu, started = _cpu(), time.perf_counter()
    producer = Producer(settings)
    producer.list_topics(timeout=10.0)  # on the clock, as the relay's sink's start-up probe is
    produce, poll = producer.produce, producer.poll
    if deletes:
        deleter.start()
    await stream.start(10.0)
    seen = 0
    while seen < events:
        ids: list[bytes] = []
        for frame in await stream.read_frames(5.0, 10_000):
            if frame[0] != XLOG_DATA:
                continue
            kind = frame[XLOG_HEADER]
            if kind == INSERT:
                picked = pick_columns(frame, XLOG_HEADER + 6, places, len(wanted))
                key, payload = picked[0], picked[1]
                assert payload is not None
                header: list[tuple[str, str | bytes | None]] | None = None
                if contract:
                    ids.append(picked[2] or b"")
                    header = [(IDEMPOTENCY_HEADER, picked[3])]
                while True:
                    try:
                        produce(topic, payload, key, headers=header, on_delivery=delivered)
                        break
                    except BufferError:
                        poll(0.005)
                seen += 1
            elif kind == _RELATION:
                relation = pgoutput.parse_message(frame[XLOG_HEADER:])
                assert isinstance(relation, pgoutput.Relation)
                places = tuple(wanted.index(c) if c in wanted else -1 for c in relation.columns)
        poll(0)  # serve the delivery reports so far, once a read
        if ids and deletes:
            unsent.append((seen, ids))
        while unsent and report["acked"] >= unsent[0][0]:
            to_delete.put(unsent.pop(0)[1])
    left = producer.flush(PUBLISH_TIMEOUT_SECONDS * 2)
    for _, ids in unsent:
        to_delete.put(ids)
    to_delete.put(None)
    if deletes:
        deleter.join()
    elapsed = time.perf_counter() - started
    spent = _cpu() - cpu
    await stream.close()
    if report["failed"] or left:
        raise RuntimeError(f"L_log_kafka: {report['failed']} deliveries failed, {left} unreported")
    if deletes:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT count(*) FROM outbox").fetchone()
        if row is None or row[0]:
            raise RuntimeError(f"L_log_kafka_contract: {row} rows left undeleted")
    return {"seconds": elapsed, "rate": events / elapsed, "cpu_per_1000": spent / events * 1000}


async def _l_log_kafka_messages(
    url: str, kafka: str, events: int, *, topic: str = "bench-log-floor"
) -> dict[str, float]:
    """L_log_kafka_messages, the floor of a drain of ``outbox`` messages: the bare stream read (as L_log_kafka's)
    producing each message's payload, with its key and ``idempotency-key`` header, to Kafka with the relay's
    producer settings until every delivery is reported. The envelope is parsed with plain ``json.loads`` and the
    payload written back with ``json.dumps`` (no jsonb text, no checks): no event, no batch, no judge, and
    nothing to delete."""
    stream = _slot_stream(url)
    settings, report, delivered = _floor_producer(kafka)
    loads, dumps = json.loads, json.JSONEncoder(ensure_ascii=False).encode
    cpu, started = _cpu(), time.perf_counter()
    producer = Producer(settings)
    producer.list_topics(timeout=10.0)  # on the clock, as the relay's sink's start-up probe is
    produce, poll = producer.produce, producer.poll
    await stream.start(10.0)
    seen = 0
    while seen < events:
        for frame in await stream.read_frames(5.0, 10_000):
            if frame[0] != XLOG_DATA or frame[XLOG_HEADER] != _MESSAGE:
                continue
            # 'M', transactional flag, LSN (8), the prefix up to its NUL, the content's length (4), the content.
            at = frame.index(0, XLOG_HEADER + 10) + 5
            envelope = loads(frame[at:])
            key = envelope["key"]
            header = [(IDEMPOTENCY_HEADER, envelope["idempotency_key"])]
            payload = dumps(envelope["payload"])
            while True:
                try:
                    produce(topic, payload, key, headers=header, on_delivery=delivered)
                    break
                except BufferError:
                    poll(0.005)
            seen += 1
        poll(0)  # serve the delivery reports so far, once a read
    left = producer.flush(PUBLISH_TIMEOUT_SECONDS * 2)
    elapsed = time.perf_counter() - started
    spent = _cpu() - cpu
    await stream.close()
    if report["failed"] or left:
        raise RuntimeError(f"L_log_kafka_messages: {report['failed']} deliveries failed, {left} unreported")
    return {"seconds": elapsed, "rate": events / elapsed, "cpu_per_1000": spent / events * 1000}


def _delete_rows(url: str, deletes: queue.SimpleQueue[list[bytes] | None]) -> None:
    """Delete each list of ids put on ``deletes`` (as a text array: one value, no per-id dump) until None."""
    with psycopg.connect(url, autocommit=True) as conn:
        while (ids := deletes.get()) is not None:
            conn.execute("DELETE FROM outbox WHERE id = ANY(%s::bigint[])", [(b"{" + b",".join(ids) + b"}").decode()])


class _TimedSink(MemorySink):
    """An in-memory sink that notes when each event was handed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: dict[int, float] = {}

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        now = time.perf_counter()
        for event in events:
            self.handed.setdefault(event.id, now)
        return await super().publish(events, holds)


async def _write_at(url: str, rate: float, count: int, ready: Any) -> dict[int, float]:
    """One event per transaction at ``rate`` once ``ready()``; each row id's COMMIT time (perf_counter)."""
    committed: dict[int, float] = {}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while not ready():
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        started = time.perf_counter()
        for i in range(count):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            cursor = await conn.execute(
                "INSERT INTO outbox (topic, key, payload) VALUES ('bench', %s, '{\"n\": 1}') RETURNING id",
                [f"k{i % 100}"],
            )
            row = await cursor.fetchone()
            assert row is not None
            committed[row[0]] = time.perf_counter()
    return committed


def _percentiles(committed: dict[int, float], arrived: dict[int, float]) -> dict[str, float]:
    waits = sorted((arrived[i] - at) * 1000 for i, at in committed.items())
    return {"events": len(waits), "p50_ms": waits[len(waits) // 2], "p99_ms": waits[int(len(waits) * 0.99)]}


async def _latency(url: str, rate: float, seconds: float) -> dict[str, dict[str, float]]:
    """A writer commits one event per transaction at ``rate``; the time from its COMMIT to the relay's sink,
    and, in the same run on a second slot, to the raw client: a bare loop reading the inserts' frames off the
    stream (the row id taken from the frame; nothing built, nothing confirmed). p50/p99 of each."""
    sink = _TimedSink()
    slot = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    prepare(url, TABLE, f"{slot}_raw")
    relay = LogRelay(url, TABLE, slot, sink, _settings())
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    stream = ReplicationStream(url, f"{slot}_raw", publication_name(f"{slot}_raw"), sender_timeout_seconds=60.0)
    await stream.start(10.0)
    count = int(rate * seconds)
    arrived: dict[int, float] = {}

    async def read() -> None:
        while len(arrived) < count:
            for frame in await stream.read_frames(1.0, 1000):
                if frame[0] == XLOG_DATA and frame[XLOG_HEADER] == INSERT:
                    message = pgoutput.parse_message(frame[XLOG_HEADER:])
                    assert isinstance(message, pgoutput.Insert) and message.values[0] is not None
                    arrived[int(message.values[0])] = time.perf_counter()

    reader = asyncio.create_task(read())
    committed = await _write_at(url, rate, count, lambda: relay.state.leading)
    await reader
    await stream.close()
    while len(sink.handed) < count:
        await asyncio.sleep(0.05)
    stop.set()
    await task
    return {"relay": _percentiles(committed, sink.handed), "raw": _percentiles(committed, arrived)}


def _peek(url: str) -> dict[str, float]:
    slot = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        row = conn.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1',"
            " 'publication_names', %s, 'messages', 'true')",
            [slot, slot],
        ).fetchone()
        elapsed = time.perf_counter() - started
    assert row is not None
    return {"changes": row[0], "seconds": elapsed, "rate": row[0] / elapsed}


def _writer_costs(url: str, count: int) -> dict[str, dict[str, float]]:
    """WAL bytes and wall time per commit of one event per transaction, for each way of writing it.

    The ways take turns on one connection in rounds of ``WRITER_ROUND`` commits (the first of each round
    rotating), so that a slow moment of the shared machine falls on all of them alike, not on the 5,000
    commits of one; each way's time is the median (and least) of its rounds, and ``message_over_bare``
    the median of the rounds' ratios of ``publish(via='message')`` to the bare INSERT, and the ratio of
    their least rounds (the quietest moments: a least ratio of rounds would be a stall of the other way).
    """
    payload = {"event": "order.created", "order_id": 1, "customer_id": "customer-1", "amount_cents": 4200}
    ways: dict[str, Any] = {
        BARE: lambda conn, i: conn.execute("INSERT INTO bare (payload) VALUES (%s::jsonb)", [json.dumps(payload)]),
        "publish() row": lambda conn, i: producers.publish(conn, "t", payload, key=f"k{i % 100}"),
        MESSAGE: lambda conn, i: producers.publish(conn, "t", payload, key=f"k{i % 100}", via="message"),
    }  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bare (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload jsonb)"
        )
    per_round: dict[str, list[float]] = {name: [] for name in ways}
    wal = dict.fromkeys(ways, 0)
    with psycopg.connect(url) as conn, psycopg.connect(url, autocommit=True) as watch:
        for write in ways.values():  # psycopg prepares a statement at its 5th run: none is timed unprepared
            for i in range(WRITER_WARM_UP):
                write(conn, i)
                conn.commit()
        order = list(ways.items())
        for first in range(0, count, WRITER_ROUND):
            commits = range(first, min(first + WRITER_ROUND, count))
            order.append(order.pop(0))
            for name, write in order:
                before = _lsn_on(watch)
                started = time.perf_counter()
                for i in commits:
                    write(conn, i)
                    conn.commit()
                per_round[name].append((time.perf_counter() - started) / len(commits) * 1e6)
                wal[name] += _lsn_on(watch) - before
    results = {
        name: {"wal": wal[name] / count, "us_per_commit": stats.median(times), "us_per_commit_min": min(times)}
        for name, times in per_round.items()
    }
    ratios = [message / bare for message, bare in zip(per_round[MESSAGE], per_round[BARE], strict=True)]
    least = results[MESSAGE]["us_per_commit_min"] / results[BARE]["us_per_commit_min"]
    results["message_over_bare"] = {"median": stats.median(ratios), "of_least": least, "rounds": len(ratios)}
    return results


def _big_transaction_memory(server: str, events: int) -> dict[str, float]:
    code = (
        "import asyncio, resource, sys\n"
        "from bench.log_source import _drain_log\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"asyncio.run(_drain_log(sys.argv[1], {events}))\n"
        "print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    url = _database(server, "big_tx", slot=True)
    with psycopg.connect(url) as conn:  # one transaction
        conn.execute(SEED_SQL.format(keys=DISTINCT_KEYS), {"topic": "bench", "keyed": True, "n": events})
    out = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, check=True, timeout=900)
    base, peak = map(int, out.stdout.split()[-2:])
    return {"events": events, "rss_before_mb": base / 1024, "rss_peak_mb": peak / 1024}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.log_source")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--writes", type=int, default=5_000, help="single-event transactions per writer kind")
    parser.add_argument("--big", type=int, default=100_000, help="events of the one big transaction")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="the latency run at 500 events/s")
    parser.add_argument("--kafka", action="store_true", help="drain to Kafka (Tansu) instead of an in-memory sink")
    parser.add_argument("--drains-only", action="store_true", help="the drains and floors, nothing else")
    parser.add_argument(
        "--rounds", type=int, default=DRAIN_ROUNDS, help="rounds of each spread's log and table drains, interleaved"
    )
    args = parser.parse_args(argv)
    n = args.events
    tune_collector()  # the relays run here, in this process: set as ``outbox-relay run`` sets its own
    results: dict[str, Any] = {"events": n, "drains": {}, "message_drains": {}}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(embedded_postgres(BENCH_SLOTS))
        kafka = stack.enter_context(Tansu()).bootstrap if args.kafka else None
        results["sink"] = "kafka (Tansu)" if kafka else "in-memory"
        db_url = _database(server, "l_db", slot=False)
        _seed(db_url, n)
        results["l_db"] = l_db(db_url, n)
        floor_url = _database(server, "l_log", slot=True)
        _seed(floor_url, n)
        results["l_log"] = asyncio.run(_l_log(floor_url, n))
        if kafka is not None:
            results["l_kafka"] = l_kafka(kafka, "bench-floor", n)
            floor_url = _database(server, "l_log_kafka", slot=True)
            _seed(floor_url, n)
            results["l_log_kafka"] = asyncio.run(_l_log_kafka(floor_url, kafka, n))
            floor_url = _database(server, "l_log_kafka_headers", slot=True)
            _seed(floor_url, n)
            results["l_log_kafka_headers"] = asyncio.run(_l_log_kafka(floor_url, kafka, n, headers=True))
            floor_url = _database(server, "l_log_kafka_deletes", slot=True)
            _seed(floor_url, n)
            results["l_log_kafka_contract"] = asyncio.run(_l_log_kafka(floor_url, kafka, n, headers=True, deletes=True))
            floor_url = _database(server, "l_log_kafka_messages", slot=True)
            _seed_messages(floor_url, n)
            results["l_log_kafka_messages"] = asyncio.run(_l_log_kafka_messages(floor_url, kafka, n))
        peek_url = _database(server, "peek", slot=True)
        _seed(peek_url, n, 0)
        results["peek"] = _peek(peek_url)
        _drop(server, "peek")
        rounds: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in SPREADS}
        for round_ in range(args.rounds):
            for i, (name, keys) in enumerate(SPREADS.items()):
                rounds[name].append(_drain_pair(server, f"{i}_{round_}", n, keys, kafka, log_first=round_ % 2 == 0))
                if kafka is not None and round_ == 0:  # the same events from table-less writers, once
                    message_url = _database(server, f"message_drain_{i}", slot=True)
                    _seed_messages(message_url, n, keys)
                    results["message_drains"][name] = asyncio.run(_drain_log(message_url, n, kafka, rows=False))
                    _drop(server, f"message_drain_{i}")
        results["drains"] = {name: _rounds_summary(pairs) for name, pairs in rounds.items()}
        if not args.drains_only:
            latency_url = _database(server, "latency", slot=True)
            results["latency"] = asyncio.run(_latency(latency_url, LATENCY_RATE, args.latency_seconds))
            results["writers"] = _writer_costs(_database(server, "writers", slot=True), args.writes)
            results["big_transaction"] = _big_transaction_memory(server, args.big)
    print(json.dumps(results, indent=2, default=float))
    _summary(results)


def _floor_verdict(floor: dict[str, float], ldb: dict[str, float], tables: list[dict[str, float]]) -> None:
    """Whether issue 38's targets are within what a bare Python process reaches here (L_log_kafka)."""
    rate, cpu = floor["rate"] / ldb["rate"], floor["cpu_per_1000"]
    shares = [cpu / table["cpu_per_1000"] for table in tables]
    if rate < TARGET_X_L_DB:
        print(f"L_log_kafka is {rate:.2f} x L_db, under the {TARGET_X_L_DB} x target: the drain target is above "
              "what a bare Python reader-producer does here at all")  # fmt: skip
    if max(shares) > TARGET_CPU_SHARE:
        print(f"L_log_kafka's CPU is {min(shares):.2f}-{max(shares):.2f} x the table source's, over the "
              f"{TARGET_CPU_SHARE} x target in {sum(s > TARGET_CPU_SHARE for s in shares)} of {len(shares)} "
              "spreads: there the CPU target is below what a bare Python reader-producer spends")  # fmt: skip


def _summary(results: dict[str, Any]) -> None:
    ldb, llog = results["l_db"], results["l_log"]
    print(f"L_db {ldb['rate']:,.0f}/s; L_log {llog['rate']:,.0f}/s = {llog['rate'] / ldb['rate']:.2f} x L_db "
          f"({llog['cpu_per_1000']:.3f} s CPU per 1,000)")  # fmt: skip
    if "l_kafka" in results:
        print(f"L_kafka {results['l_kafka']['rate']:,.0f}/s = {results['l_kafka']['rate'] / ldb['rate']:.2f} x L_db")
    floor = results.get("l_log_kafka")
    if floor is not None:
        print(f"L_log_kafka {floor['rate']:,.0f}/s = {floor['rate'] / ldb['rate']:.2f} x L_db "
              f"({floor['cpu_per_1000']:.3f} s CPU per 1,000)")  # fmt: skip
    for name, said in (("l_log_kafka_headers", "+ the idempotency-key header"),
                       ("l_log_kafka_contract", "+ the header, the delivered rows deleted beside it")):  # fmt: skip
        if name in results:
            floor_of = results[name]
            print(f"L_{name[2:]} ({said}) {floor_of['rate']:,.0f}/s = {floor_of['rate'] / ldb['rate']:.2f} x L_db "
                  f"({floor_of['cpu_per_1000']:.3f} s CPU per 1,000)")  # fmt: skip
    print(f"server decoding alone (peek): {results['peek']['rate']:,.0f} changes/s")
    for name, drain in results["drains"].items():
        log, table, ratio = drain["log"], drain["table"], drain["log_over_table"]
        versus_floor = f"{log['rate'] / floor['rate']:.2f} x L_log_kafka, " if floor is not None else ""
        print(f"{name} ({len(drain['rounds'])} rounds, medians): log {log['rate']:,.0f}/s = "
              f"{log['rate'] / ldb['rate']:.2f} x L_db, {log['rate'] / llog['rate']:.2f} x L_log, {versus_floor}"
              f"table source {table['rate']:,.0f}/s; log / table per round {ratio['median']:.2f} x "
              f"({ratio['min']:.2f}-{ratio['max']:.2f}): {TARGET_X_TABLE:g} x {_drain_verdict(ratio)}; "
              f"CPU per 1,000: log {log['cpu_per_1000']:.3f} s, table {table['cpu_per_1000']:.3f} s = "
              f"{log['cpu_per_1000'] / table['cpu_per_1000']:.2f}")  # fmt: skip
    if floor is not None:
        _floor_verdict(floor, ldb, [drain["table"] for drain in results["drains"].values()])
    messages_floor = results.get("l_log_kafka_messages")
    if messages_floor is not None:
        print(f"L_log_kafka_messages (messages: the envelope parsed, the payload with its header) "
              f"{messages_floor['rate']:,.0f}/s = {messages_floor['rate'] / ldb['rate']:.2f} x L_db "
              f"({messages_floor['cpu_per_1000']:.3f} s CPU per 1,000)")  # fmt: skip
    for name, drain in results.get("message_drains", {}).items():
        versus_floor = (
            f", {drain['rate'] / messages_floor['rate']:.2f} x L_log_kafka_messages" if messages_floor else ""
        )
        print(f"{name}, messages: log {drain['rate']:,.0f}/s = {drain['rate'] / ldb['rate']:.2f} x L_db"
              f"{versus_floor}; CPU per 1,000: {drain['cpu_per_1000']:.3f} s")  # fmt: skip
    if "latency" in results:
        latency, raw = results["latency"]["relay"], results["latency"]["raw"]
        print(f"latency at {LATENCY_RATE:.0f}/s from COMMIT: relay (to the sink) p50 {latency['p50_ms']:.1f} ms, "
              f"p99 {latency['p99_ms']:.1f} ms; raw client (to the frame) p50 {raw['p50_ms']:.1f} ms, "
              f"p99 {raw['p99_ms']:.1f} ms; the relay's own: p99 {latency['p99_ms'] - raw['p99_ms']:.1f} ms over "
              "the raw client's")  # fmt: skip
    if "writers" not in results:
        return
    writers, drain = results["writers"], results["drains"]["1,000 keys"]
    log, table = drain["log"], drain["table"]
    bare = writers[BARE]
    row_total = writers["publish() row"]["wal"] + log["wal"]
    message_total = writers[MESSAGE]["wal"]
    table_total = writers["publish() row"]["wal"] + table["wal"]
    print(f"WAL bytes per event (writer + relay): table source {table_total:.0f}, log source rows {row_total:.0f} "
          f"({row_total / table_total:.2f}), messages {message_total:.0f} "
          f"({message_total / table_total:.2f})")  # fmt: skip
    message, ratio = writers[MESSAGE], writers["message_over_bare"]
    print(f"publish(via='message') commit vs bare jsonb INSERT, {ratio['rounds']:.0f} interleaved rounds: median "
          f"{message['us_per_commit']:.0f} vs {bare['us_per_commit']:.0f} us, median of the rounds' ratios "
          f"{ratio['median']:.2f} x; least {message['us_per_commit_min']:.0f} vs {bare['us_per_commit_min']:.0f} us "
          f"= {ratio['of_least']:.2f} x")  # fmt: skip
    big = results["big_transaction"]
    print(
        f"one {big['events']:,}-event transaction: peak RSS {big['rss_peak_mb']:.0f} MB "
        f"(from {big['rss_before_mb']:.0f} MB)"
    )


if __name__ == "__main__":
    main()
