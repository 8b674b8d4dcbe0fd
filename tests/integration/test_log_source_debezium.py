"""The log source on Debezium's outbox table layout (embedded PostgreSQL, wal_level=logical): the rows go
out as the table store's Debezium adapter sends them, in commit order per aggregateid; a poison row parks
its aggregateid until ``requeue``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from relay.cli import main
from relay.config import TableLayout, TableName, parse_sink_url
from relay.events import Failure
from relay.log_relay import LogRelay
from relay.sinks import build_sink
from relay.sinks.base import Sink
from relay.sinks.memory import MemorySink
from tests.integration.kafka_support import consume
from tests.log_support import caught_up, database_on, settings, synchronous, until

TABLE = TableName.parse("dbz_outbox")


@contextlib.contextmanager
def _database(server: str, create: str | None = None) -> Iterator[tuple[str, str]]:
    """A new database whose Debezium table (``create``d first, if given), publication and slot
    ``migrate --source log`` made: (URL, slot)."""
    suffix = uuid.uuid4().hex[:10]
    name, slot = f"dbz_{suffix}", f"slot_{suffix}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = database_on(server, name)
    if create:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(create)
    argv = ["migrate", "--database-url", url, "--table", str(TABLE), "--table-layout", "debezium"]
    assert main([*argv, "--source", "log", "--slot", slot]) == 0
    yield url, slot
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", [slot]
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def debezium_database(logical_server: str) -> Iterator[tuple[str, str]]:
    """A new database with Debezium's default outbox table, its publication and slot: (URL, slot)."""
    with _database(logical_server) as found:
        yield found


@contextlib.asynccontextmanager
async def _running(url: str, slot: str, sink: Sink, layout: TableLayout) -> AsyncIterator[LogRelay]:
    relay = LogRelay(url, TABLE, slot, sink, settings(), layout=layout)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        yield relay
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def _insert(conn: psycopg.Connection, kind: str, key: str, payload: object) -> str:
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO dbz_outbox (id, aggregatetype, aggregateid, type, payload) VALUES (%s, %s, %s, %s, %s::jsonb)",
        [event_id, kind, key, f"{kind}Created", json.dumps(payload)],
    )
    return event_id


def _rows(url: str) -> list[tuple[str, str, str | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT aggregateid, relay_state, relay_last_error FROM dbz_outbox ORDER BY relay_seq")
        return rows.fetchall()


def test_migrate_publishes_the_debezium_table(debezium_database: tuple[str, str]) -> None:
    url, slot = debezium_database
    with psycopg.connect(url) as conn:
        tables = conn.execute("SELECT tablename FROM pg_publication_tables WHERE pubname = %s", [slot]).fetchall()
        plugin = conn.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone()
    assert tables == [("dbz_outbox",)] and plugin == ("pgoutput",)
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT attnames FROM pg_publication_tables WHERE pubname = %s", [slot]).fetchone()
    assert row is not None
    # Every application column (any may be a --field-header), the relay columns the reader reads, no other.
    assert set(row[0]) == {"id", "aggregatetype", "aggregateid", "type", "payload", "relay_seq", "relay_state",
                           "relay_last_error", "relay_created_at"}  # fmt: skip


@synchronous
async def test_kafka_topic_key_id_header_order_per_aggregateid_rolled_back_never(
    debezium_database: tuple[str, str], kafka_bootstrap: str
) -> None:
    url, slot = debezium_database
    prefix = f"dbz{uuid.uuid4().hex[:8]}"
    layout = TableLayout.parse("debezium", topic_template=f"{prefix}.{{aggregatetype}}", field_headers=["type=kind"])
    ids: dict[int, str] = {}
    with psycopg.connect(url, autocommit=True) as one, psycopg.connect(url, autocommit=True) as two:
        # Interleaved: the transaction that starts first commits last; commit order is what goes out.
        one.execute("BEGIN")
        ids[1] = _insert(one, "order", "a", {"n": 1})
        two.execute("BEGIN")
        ids[2] = _insert(two, "order", "a", {"n": 2})
        ids[3] = _insert(two, "invoice", "b", {"n": 3})
        two.execute("COMMIT")
        ids[4] = _insert(one, "invoice", "b", {"n": 4, "x": [1, 2]})
        one.execute("COMMIT")
        with one.transaction(force_rollback=True):
            _insert(one, "order", "a", {"n": 99})
        ids[5] = _insert(one, "order", "a", {"n": 5})
    sink = build_sink(parse_sink_url(f"kafka://{kafka_bootstrap}"), publish_timeout_seconds=10)
    done = caught_up(url, slot)
    async with _running(url, slot, sink, layout):
        await until(lambda: not _rows(url) and done())
    got = await asyncio.to_thread(consume, kafka_bootstrap, [f"{prefix}.order", f"{prefix}.invoice"], count=5)
    by_key: dict[bytes | None, list[int]] = {}
    for record in got:
        n = json.loads(record.value)["n"]
        by_key.setdefault(record.key, []).append(n)
        assert record.topic == f"{prefix}.{'order' if record.key == b'a' else 'invoice'}"
        assert record.headers["id"] == ids[n].encode() == record.headers["idempotency-key"]
        assert record.headers["kind"] == (b"orderCreated" if record.key == b"a" else b"invoiceCreated")
    assert by_key == {b"a": [2, 1, 5], b"b": [3, 4]}
    assert next(r.value for r in got if json.loads(r.value)["n"] == 4) == b'{"n": 4, "x": [1, 2]}'


def _cli(url: str, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "relay", *args, "--database-url", url, "--table", str(TABLE), "--table-layout",
         "debezium"], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


@synchronous
async def test_a_poison_row_is_dead_lettered_in_place_and_parks_its_aggregateid_until_requeue(
    debezium_database: tuple[str, str],
) -> None:
    url, slot = debezium_database
    layout = TableLayout.parse("debezium")
    with psycopg.connect(url) as conn:
        poison_id = _insert(conn, "order", "bad", {"n": 0, "poison": True})
        _insert(conn, "order", "bad", {"n": 1})
        _insert(conn, "order", "good", {"n": 2})
    poison = {"on": True}
    sink = MemorySink(
        fail=lambda e: Failure("refused", permanent=True) if poison["on"] and b"poison" in e.payload else None
    )
    async with _running(url, slot, sink, layout):
        await until(lambda: [(key, state) for key, state, _ in _rows(url)] == [("bad", "failed"), ("bad", "pending")])
        assert all(error for *_, error in _rows(url))
        with psycopg.connect(url) as conn:
            _insert(conn, "order", "bad", {"n": 3})
            # Not read on this layout: the table could not keep its dead letter.
            envelope = {"topic": "outbox.event.order", "key": "good", "payload": {"n": 9}}
            conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s)", [json.dumps(envelope)])
            _insert(conn, "order", "good", {"n": 4})
        await until(lambda: len(sink.delivered) >= 2 and len(_rows(url)) == 3)
        await asyncio.sleep(1.0)
        assert [json.loads(e.payload)["n"] for e in sink.delivered] == [2, 4]
        dead = json.loads(_cli(url, "dead", "--json"))
        assert [d["idempotency_key"] for d in dead] == [poison_id]
        poison["on"] = False
        _cli(url, "requeue", "--key", "bad")
        await until(lambda: not _rows(url), timeout=30)
    bad = [e for e in sink.delivered if e.key == "bad"]
    assert [json.loads(e.payload)["n"] for e in bad] == [0, 1, 3]
    assert bad[0].headers == {"id": poison_id} and bad[0].topic == "outbox.event.order"


#: Each payload type the Debezium layout relays, and payloads of it (a null among them).
_PAYLOADS = {
    "jsonb": ['{"b": 1, "a": [1.50, "é"]}', "[]", None],
    "json": ['{"b": 1,  "a": [1.50, "é"]}', None],
    "text": ["plain é", "", None],
    "varchar(50)": ["short", None],
    "bytea": ["\\x00ff10", "\\x", None],
}


@pytest.mark.parametrize("kind", list(_PAYLOADS))
@synchronous
async def test_each_payload_type_gives_the_event_the_table_store_builds(logical_server: str, kind: str) -> None:
    create = (
        f"CREATE TABLE dbz_outbox (id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text,"
        f" type text, payload {kind}, tenant text)"
    )
    layout = TableLayout.parse("debezium", topic_template="t.{aggregatetype}.x", field_headers=["tenant=tenant"])
    with _database(logical_server, create) as (url, slot):
        with psycopg.connect(url) as conn:
            for n, payload in enumerate(_PAYLOADS[kind]):
                conn.execute(
                    "INSERT INTO dbz_outbox VALUES (gen_random_uuid(), %s, %s, 'T', %s, %s)",
                    ["" if n == 1 else f"agg{n}", None if n == 2 else f"k{n}", payload, None if n else "acme"],
                )
        options = "-c outbox_relay.topic_template=t.{aggregatetype}.x"
        with psycopg.connect(url, options=options, row_factory=psycopg.rows.dict_row) as conn:
            view = conn.execute(
                "SELECT id, topic, key, payload::text, payload_bytes, content_type, idempotency_key, created_at,"
                " (SELECT tenant FROM dbz_outbox d WHERE d.id::text = v.idempotency_key) AS tenant"
                " FROM dbz_outbox_relay v ORDER BY id"
            ).fetchall()
        sink = MemorySink()
        async with _running(url, slot, sink, layout):
            await until(lambda: len(sink.delivered) >= len(view) and not _rows(url))
    expected = [
        (r["id"], r["topic"], r["key"], bytes(r["payload_bytes"]) if r["payload"] is None else r["payload"].encode(),
         r["content_type"], r["idempotency_key"], r["created_at"],
         {"id": r["idempotency_key"], **({"tenant": r["tenant"]} if r["tenant"] else {})})
        for r in view
    ]  # fmt: skip
    got = [(e.id, e.topic, e.key, e.payload, e.content_type, e.idempotency_key, e.created_at, e.headers)
           for e in sink.delivered]  # fmt: skip
    assert got == expected
