"""The log source's publication on a real PostgreSQL (embedded, wal_level=logical): its column list, and
that the reader still gets every column an event needs through it."""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

import producers
from relay.events import Event
from relay.sinks.memory import MemorySink
from relay.sources.log.publication import prepare
from relay.store.migrate import migrate
from tests.log_support import TABLE, caught_up, database_on, running, synchronous, until

#: The native table's columns the reader reads (relay.sources.log.decode), in the table's order.
READ = ["id", "topic", "key", "payload", "headers", "idempotency_key", "state", "last_error", "created_at",
        "payload_bytes", "content_type"]  # fmt: skip


@pytest.fixture
def fresh(logical_server: str) -> Iterator[str]:
    """A new migrated database with no publication yet."""
    name = f"pub_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(logical_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = database_on(logical_server, name)
    migrate(url, TABLE)
    yield url
    with psycopg.connect(logical_server, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = %s",
                     [name])  # fmt: skip
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _published(url: str, publication: str) -> list[str]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT attnames FROM pg_publication_tables WHERE pubname = %s", [publication]).fetchone()
    assert row is not None
    return list(row[0])


def test_migrate_publishes_only_the_columns_the_reader_reads_and_again_changes_nothing(fresh: str) -> None:
    slot = "pub_cols"
    assert prepare(fresh, TABLE, slot) == [f"publication {slot}", f"slot {slot}"]
    assert _published(fresh, slot) == READ
    assert prepare(fresh, TABLE, slot) == []


def test_a_publication_of_every_column_gets_the_column_list(fresh: str) -> None:
    slot = "pub_old"
    with psycopg.connect(fresh, autocommit=True) as conn:  # as a migrate before the column list made it
        conn.execute(f"CREATE PUBLICATION {slot} FOR TABLE outbox WITH (publish = 'insert, update')")
    assert f"column list of public.outbox in publication {slot}" in prepare(fresh, TABLE, slot)
    assert _published(fresh, slot) == READ
    with psycopg.connect(fresh) as conn:
        row = conn.execute("SELECT pubupdate FROM pg_publication WHERE pubname = %s", [slot]).fetchone()
    assert row == (False,)


@synchronous
async def test_every_field_of_an_event_arrives_through_the_column_list(fresh: str) -> None:
    slot = "pub_events"
    prepare(fresh, TABLE, slot)
    with psycopg.connect(fresh) as conn:
        producers.publish(conn, "t", {"n": 1}, key="k", headers={"h": "v"}, idempotency_key="i-1")
        producers.publish(conn, "t", b"\x00\x01", key="k", content_type="application/x-raw", idempotency_key="i-2")
        conn.commit()
    sink = MemorySink()
    async with running(fresh, slot, sink):
        await until(lambda: len(sink.delivered) == 2)
        await until(caught_up(fresh, slot))
    first, second = sink.delivered
    assert isinstance(first, Event) and isinstance(second, Event)
    assert (first.topic, first.key, json.loads(first.payload), first.headers, first.idempotency_key) == (
        "t", "k", {"n": 1}, {"h": "v"}, "i-1"
    )  # fmt: skip
    assert (second.payload, second.content_type, second.idempotency_key) == (b"\x00\x01", "application/x-raw", "i-2")
    assert first.id < second.id and first.created_at is not None


@synchronous
async def test_big_values_arrive_whole_through_the_column_list(fresh: str) -> None:
    """Values PostgreSQL keeps out of line (TOAST: multi-MB jsonb, compressible or not, a multi-MB bytea,
    a jsonb of many long headers) and a non-ASCII hot key, in one transaction, arrive byte for byte."""
    slot = "pub_big"
    prepare(fresh, TABLE, slot)
    noise = base64.b64encode(os.urandom(3 * 1024 * 1024)).decode()  # incompressible, ~4 MB
    raw = os.urandom(3 * 1024 * 1024)
    headers = {f"h-{n}": "ü" * 2000 for n in range(200)}  # ~800 KB of headers
    key = "клиент/42@ü%"
    with psycopg.connect(fresh) as conn:
        producers.publish(conn, "t", {"noise": noise}, key=key, idempotency_key="big-1")
        producers.publish(conn, "t", {"same": "a" * 5_000_000}, key=key, idempotency_key="big-2")  # compresses
        producers.publish(conn, "t", raw, key=key, content_type="application/octet-stream", idempotency_key="big-3")
        producers.publish(conn, "t", {"n": 4}, key=key, headers=headers, idempotency_key="big-4")
        conn.commit()
    sink = MemorySink()
    async with running(fresh, slot, sink):
        await until(lambda: len(sink.delivered) == 4, timeout=60)
        await until(caught_up(fresh, slot))
    events = sink.delivered
    assert [e.idempotency_key for e in events] == ["big-1", "big-2", "big-3", "big-4"]  # the key's order
    assert all(e.key == key for e in events)
    assert json.loads(events[0].payload) == {"noise": noise}
    assert json.loads(events[1].payload) == {"same": "a" * 5_000_000}
    assert events[2].payload == raw and events[2].content_type == "application/octet-stream"
    assert events[3].headers == headers
