"""The hand-over of a table's backlog when migrate makes the log source's slot, and its delivery by the sweep."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from relay.cli import main
from relay.config import TableLayout
from relay.events import Failure
from relay.sinks.memory import MemorySink
from relay.sources.log import publication
from relay.sources.log.publication import prepare
from relay.store.migrate import migrate
from tests.integration.test_log_source_debezium import TABLE as DBZ
from tests.integration.test_log_source_debezium import _insert, _running
from tests.log_support import TABLE, new_database, running, synchronous, until


@pytest.fixture
def fresh(logical_server: str) -> Iterator[tuple[str, str]]:
    """A new database with the outbox table, and no slot yet: (URL, the slot's name)."""
    with new_database(logical_server) as (url, slot):
        migrate(url, TABLE)
        yield url, slot


def _backlog(url: str, rows: int, key: str | None = "k") -> None:
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload) SELECT 't', %s, jsonb_build_object('n', n)"
            " FROM generate_series(0, %s - 1) AS n",
            [key, rows],
        )


def _left(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT id, last_error IS NOT NULL FROM outbox WHERE state = 'pending' ORDER BY id"
        ).fetchall()


def test_a_hand_over_cut_off_halfway_is_finished_by_the_next_migrate(
    fresh: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A big backlog, handed over in steps; the connection is lost (or migrate stopped) after the first step.
    url, slot = fresh
    _backlog(url, 30)
    monkeypatch.setattr(publication, "HAND_OVER_ROWS", 10)
    real = psycopg.Connection.execute
    steps = 0

    def execute(self: psycopg.Connection[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        nonlocal steps
        if "RETURNING id" in str(query) and "last_error" in str(query):
            steps += 1
            if steps == 2:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(self, query, params, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    with pytest.raises(Exception):  # noqa: B017 - whatever migrate reports
        prepare(url, TABLE, slot)
    monkeypatch.setattr(psycopg.Connection, "execute", real)
    prepare(url, TABLE, slot)  # the operator runs migrate again, as the docs say it is safe to
    not_handed = [row for row in _left(url) if not row[1]]
    assert not_handed == [], f"{len(not_handed)} rows written before the slot are never streamed nor swept"


def test_rows_with_ids_below_one_are_handed_over_too(fresh: tuple[str, str]) -> None:
    # Plain SQL may write any id (the claim's full scan starts at the least bigint for them).
    url, slot = fresh
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO outbox (id, topic, key, payload) VALUES (-5, 't', 'k', '{}'), (0, 't', 'k', '{}')")
    _backlog(url, 2)
    prepare(url, TABLE, slot)
    assert [row for row in _left(url) if not row[1]] == []


@synchronous
async def test_a_backlog_of_one_key_drains_at_more_than_one_event_a_second(fresh: tuple[str, str]) -> None:
    url, slot = fresh
    _backlog(url, 20)
    prepare(url, TABLE, slot)
    sink = MemorySink()
    started = time.monotonic()
    async with running(url, slot, sink):
        await until(lambda: len({json.loads(e.payload)["n"] for e in sink.delivered}) >= 20, timeout=60)
    took = time.monotonic() - started
    assert [json.loads(e.payload)["n"] for e in sink.delivered] == list(range(20))
    # The table source sends these 20 in one claim; a batch size of 100.
    assert took < 8, f"20 events of one key took {took:.1f} s"


def test_two_migrates_at_once_make_one_slot_and_leave_no_other(fresh: tuple[str, str]) -> None:
    url, slot = fresh
    _backlog(url, 5)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: prepare(url, TABLE, slot), range(4)))
    assert sum(f"slot {slot}" in r for r in results) == 1, results
    with psycopg.connect(url) as conn:
        slots = [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()]
    assert slot in slots and not [s for s in slots if s.startswith("outbox_relay_new_")], slots
    assert [row for row in _left(url) if not row[1]] == []


@synchronous
async def test_a_debezium_table_s_backlog_is_handed_over_and_delivered_in_order(logical_server: str) -> None:
    with new_database(logical_server, "dbz") as (url, slot):
        argv = ["migrate", "--database-url", url, "--table", str(DBZ), "--table-layout", "debezium"]
        assert main(argv) == 0
        with psycopg.connect(url, autocommit=True) as conn:
            for n in range(3):
                _insert(conn, "Order", "a", {"n": n})
        assert main([*argv, "--source", "log", "--slot", slot]) == 0
        with psycopg.connect(url, autocommit=True) as conn:
            for n in range(3, 5):
                _insert(conn, "Order", "a", {"n": n})
        sink = MemorySink()
        async with _running(url, slot, sink, TableLayout.parse("debezium")):
            await until(lambda: len({json.loads(e.payload)["n"] for e in sink.delivered}) >= 5, timeout=20)
        firsts = list(dict.fromkeys(json.loads(e.payload)["n"] for e in sink.delivered))
        assert firsts == list(range(5))
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM dbz_outbox WHERE relay_state = 'pending'").fetchone() == (0,)


@synchronous
async def test_a_run_of_a_key_whose_first_event_fails_waits_behind_its_retry(fresh: tuple[str, str]) -> None:
    url, slot = fresh
    _backlog(url, 6)
    prepare(url, TABLE, slot)
    tries: dict[int, int] = {}

    def fail(event: Any) -> Any:
        n = json.loads(event.payload)["n"]
        tries[n] = tries.get(n, 0) + 1
        return Failure("no") if n in (0, 3) and tries[n] == 1 else None

    sink = MemorySink(fail)
    async with running(url, slot, sink):
        await until(lambda: len(sink.delivered) >= 6, timeout=20)
    assert [json.loads(e.payload)["n"] for e in sink.delivered] == list(range(6))
