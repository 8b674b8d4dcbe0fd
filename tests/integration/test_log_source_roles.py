"""The log source run as the relay role ``migrate --create-roles --source log`` grants (with REPLICATION,
which a role attribute cannot pass on through membership: the login role is given it)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from relay.cli import main
from relay.errors import StoreError
from relay.events import Failure
from relay.log_relay import LogRelay
from relay.sinks.memory import MemorySink
from tests.log_support import TABLE, database_on, running, settings, synchronous, until


def _inserts(url: str, role: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attnum > 0"
            " AND has_column_privilege(%s, attrelid, attname, 'INSERT') ORDER BY attnum",
            [role],
        )
        return [row[0] for row in rows]


@pytest.fixture
def relay_login(logical_server: str) -> Iterator[tuple[str, str, str, str, str]]:
    """A database migrated with --create-roles for the log source: (admin URL, relay login URL, slot, relay
    role, writer role)."""
    suffix = uuid.uuid4().hex[:10]
    name, slot, relay, writer, login = (f"{p}_{suffix}" for p in ("roles", "slot", "relay", "writer", "login"))
    with psycopg.connect(logical_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = database_on(logical_server, name)
    argv = ["migrate", "--database-url", url, "--create-roles", "--relay-role", relay, "--writer-role", writer]
    assert main([*argv, "--source", "log", "--slot", slot]) == 0
    with psycopg.connect(logical_server, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{login}" LOGIN REPLICATION IN ROLE "{relay}"')
    conninfo = psycopg.conninfo.conninfo_to_dict(url)
    conninfo["user"] = login
    yield url, psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in conninfo.items()}), slot, relay, writer
    with psycopg.connect(logical_server, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", [slot]
        )
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for role in (login, relay, writer):
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


@synchronous
async def test_the_created_relay_role_delivers_dead_letters_and_parks(
    relay_login: tuple[str, str, str, str, str],
) -> None:
    url, as_relay, slot, _, _ = relay_login
    with psycopg.connect(url) as conn:
        for key, payload in (("ok", {"n": 0}), ("bad", {"n": 1, "poison": True}), ("bad", {"n": 2})):
            conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', %s, %s)", [key, json.dumps(payload)])
        envelope = {"topic": "t", "key": "msg", "payload": {"n": 3, "poison": True}}
        conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s)", [json.dumps(envelope)])
    sink = MemorySink(fail=lambda e: Failure("refused", permanent=True) if b"poison" in e.payload else None)

    def rows() -> list[tuple[str, str]]:
        with psycopg.connect(url) as conn:
            return conn.execute("SELECT key, state FROM outbox ORDER BY id").fetchall()

    async with running(as_relay, slot, sink):
        # The delivered row deleted; the row's and the message's dead letters, and the row parked behind one.
        await until(lambda: sorted(rows()) == [("bad", "failed"), ("bad", "pending"), ("msg", "failed")])
    assert [json.loads(e.payload)["n"] for e in sink.delivered] == [0]


def test_the_relay_role_inserts_only_under_the_log_source(relay_login: tuple[str, str, str, str, str]) -> None:
    url, _, slot, relay, writer = relay_login
    assert "priority" not in _inserts(url, relay) and "deliver_at" not in _inserts(url, relay)
    assert {"id", "state", "last_error", "topic", "payload"} <= set(_inserts(url, relay))
    # Without --source log, migrate --create-roles takes the INSERT back: a table relay inserts nothing.
    argv = ["migrate", "--database-url", url, "--create-roles", "--relay-role", relay, "--writer-role", writer]
    assert main(argv) == 0
    assert _inserts(url, relay) == []
    assert main([*argv, "--source", "log", "--slot", slot]) == 0
    assert "state" in _inserts(url, relay)


@synchronous
async def test_a_dead_letter_the_role_may_not_write_stops_the_relay_in_one_line_confirming_nothing_past_it(
    relay_login: tuple[str, str, str, str, str],
) -> None:
    url, as_relay, slot, relay_role, _ = relay_login
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'REVOKE INSERT, UPDATE ON outbox FROM "{relay_role}"')
        before = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", [slot])
        confirmed = before.fetchone()
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{\"poison\": true}')")
    sink = MemorySink(fail=lambda e: Failure("refused", permanent=True))
    relay = LogRelay(as_relay, TABLE, slot, sink, settings())
    with pytest.raises(StoreError) as raised:
        await asyncio.wait_for(relay.run(asyncio.Event()), 30)
    message = str(raised.value)
    assert "\n" not in message and "permission denied" in message and "--create-roles --source log" in message
    assert "dead letter" in message
    with psycopg.connect(url) as conn:
        after = conn.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", [slot])
        assert after.fetchone() == confirmed  # not advanced: the event is read again next time
        assert conn.execute("SELECT state, last_error FROM outbox").fetchall() == [("pending", None)]
