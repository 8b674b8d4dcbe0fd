"""The log source on a real PostgreSQL (embedded, wal_level=logical): what it delivers, in what order, and
what it confirms."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import psycopg
import pytest

from relay.events import Event, Failure
from relay.sinks.memory import MemorySink
from relay.sources.log.pgoutput import parse_lsn
from tests.log_support import caught_up, confirmed_lsn, running, synchronous, until


def _insert(conn: psycopg.Connection, topic: str, key: str | None, payload: object) -> None:
    conn.execute(
        "INSERT INTO outbox (topic, key, payload) VALUES (%s, %s, %s::jsonb)", [topic, key, json.dumps(payload)]
    )


def _message(conn: psycopg.Connection, envelope: dict[str, object]) -> None:
    conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s)", [json.dumps(envelope)])


def _outbox_rows(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT id, state, key, last_error FROM outbox ORDER BY id").fetchall()


@synchronous
async def test_rows_and_messages_in_commit_order_rolled_back_never(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    sink = MemorySink()
    with psycopg.connect(url, autocommit=True) as one, psycopg.connect(url, autocommit=True) as two:
        # Interleaved: the first transaction to start commits last.
        one.execute("BEGIN")
        _insert(one, "orders", "a", {"n": 1})
        two.execute("BEGIN")
        _insert(two, "orders", "a", {"n": 2})
        _message(two, {"topic": "orders", "key": "a", "payload": {"n": 3}, "headers": {"h": "v"}})
        two.execute("COMMIT")
        _message(one, {"topic": "bytes", "key": "b", "payload": "AAEC", "content_type": "application/x-raw"})
        one.execute("COMMIT")
        with one.transaction(force_rollback=True):
            _insert(one, "orders", "a", {"rolled": "back"})
            _message(one, {"topic": "orders", "key": "a", "payload": {"rolled": "back"}})
        _message(one, {"topic": "orders", "key": None, "payload": [1, {"bb": 2, "a": 1.50}], "idempotency_key": "k1"})
    async with running(url, slot, sink):
        await until(lambda: len(sink.delivered) >= 5)
        await until(lambda: not _outbox_rows(url))
        await asyncio.sleep(0.3)
    got = [(e.topic, e.key, e.payload, e.content_type) for e in sink.delivered]
    assert got == [
        ("orders", "a", b'{"n": 2}', None),
        ("orders", "a", b'{"n": 3}', None),
        ("orders", "a", b'{"n": 1}', None),
        ("bytes", "b", b"\x00\x01\x02", "application/x-raw"),
        ("orders", None, b'[1, {"a": 1.5, "bb": 2}]', None),
    ]
    assert sink.delivered[1].headers == {"h": "v"}
    assert sink.delivered[4].idempotency_key == "k1"
    assert len({e.idempotency_key for e in sink.delivered}) == 5
    # Confirmed: a new relay on the slot delivers nothing again.
    again = MemorySink()
    async with running(url, slot, again):
        await asyncio.sleep(1.5)
    assert again.delivered == []


@synchronous
async def test_a_crash_before_the_confirm_redelivers_the_whole_transaction(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    before = confirmed_lsn(url, slot)
    with psycopg.connect(url) as conn:
        for n in range(5):
            _insert(conn, "t", f"k{n % 2}", {"n": n})
    # The broker refuses the fourth event until told otherwise: the transaction is never wholly done.
    failing = MemorySink(fail=lambda e: Failure("down") if json.loads(e.payload)["n"] == 3 else None)
    async with running(url, slot, failing, max_attempts=1000):
        await until(lambda: len(failing.delivered) >= 3)
        await asyncio.sleep(1.0)
    assert confirmed_lsn(url, slot) == before
    healthy = MemorySink()
    async with running(url, slot, healthy):
        await until(lambda: len(healthy.delivered) >= 5)
    assert sorted(json.loads(e.payload)["n"] for e in healthy.delivered) == [0, 1, 2, 3, 4]
    # Per key, in order.
    for key in ("k0", "k1"):
        ns = [json.loads(e.payload)["n"] for e in healthy.delivered if e.key == key]
        assert ns == sorted(ns)


def _admin(url: str, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "relay", *args, "--database-url", url],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


def _n(event: Event) -> int:
    return int(json.loads(event.payload)["n"])


@pytest.mark.parametrize("release", ["requeue", "skip"])
@synchronous
async def test_poison_parks_its_key_until_requeue_or_skip_then_the_key_goes_on_in_order(
    log_database: tuple[str, str], release: str
) -> None:
    url, slot = log_database
    with psycopg.connect(url) as conn:
        _insert(conn, "t", "bad", {"n": 0, "poison": True})
        _insert(conn, "t", "bad", {"n": 1})
        _message(conn, {"topic": "t", "key": "bad", "payload": {"n": 2}})
        _insert(conn, "t", "good", {"n": 3})
        _message(conn, {"topic": "t", "key": "good", "payload": {"n": 4}})
    poison = {"on": True}
    sink = MemorySink(
        fail=lambda e: Failure("refused", permanent=True) if poison["on"] and b"poison" in e.payload else None
    )
    async with running(url, slot, sink):
        await until(lambda: len(sink.delivered) >= 2)
        expected = [("failed", "bad"), ("pending", "bad"), ("pending", "bad")]
        await until(lambda: [(state, key) for _, state, key, _ in _outbox_rows(url)] == expected)
        rows = _outbox_rows(url)
        assert all(error for *_, error in rows)
        assert json.loads(_admin(url, "dead", "--json"))[0]["id"] == rows[0][0]
        # Later events of the parked key, from both writers, wait behind it in the table; others flow.
        with psycopg.connect(url) as conn:
            _message(conn, {"topic": "t", "key": "bad", "payload": {"n": 5}})
            _insert(conn, "t", "bad", {"n": 6})
            _insert(conn, "t", "good", {"n": 7})
        await until(lambda: len(sink.delivered) >= 3)
        await until(lambda: [key for _, _, key, _ in _outbox_rows(url)] == ["bad"] * 5)
        await asyncio.sleep(1.5)
        assert [_n(e) for e in sink.delivered] == [3, 4, 7]
        poison["on"] = False
        if release == "requeue":
            _admin(url, "requeue", "--key", "bad")
        else:
            _admin(url, "skip", "--id", str(rows[0][0]))
        await until(lambda: all(state == "skipped" for _, state, _, _ in _outbox_rows(url)), timeout=30)
        # Unparked: the key's next events go straight from the log, after the parked ones.
        with psycopg.connect(url) as conn:
            _insert(conn, "t", "bad", {"n": 8})
        await until(lambda: [_n(e) for e in sink.delivered][-1] == 8)
    bad = [_n(e) for e in sink.delivered if e.key == "bad"]
    assert bad == ([0, 1, 2, 5, 6, 8] if release == "requeue" else [1, 2, 5, 6, 8])


class _SlowSink(MemorySink):
    """Acknowledges everything, a little slowly, and notes the most events the relay had in flight."""

    def __init__(self, relay_window: list[object]) -> None:
        super().__init__()
        self.windows = relay_window
        self.most_in_flight = 0

    async def publish(self, events, holds=None):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.002)
        reading = self.windows[0].log.leader.reading if self.windows else None  # type: ignore[attr-defined]
        if reading is not None:
            self.most_in_flight = max(self.most_in_flight, reading.window.events)
        return await super().publish(events, holds)


@synchronous
async def test_a_big_transaction_is_read_in_a_bounded_window_and_confirmed_only_whole(
    log_database: tuple[str, str],
) -> None:
    await big_transaction(*log_database, 20_000)


async def big_transaction(url: str, slot: str, count: int) -> None:
    """One transaction of ``count`` events: read through a bounded window, confirmed only once all are out
    (``make faults`` runs it with 100,000 events)."""
    with psycopg.connect(url) as conn:  # one transaction
        conn.execute(
            "INSERT INTO outbox (topic, key, payload) SELECT 't', 'k' || (g %% 10), jsonb_build_object('n', g)"
            " FROM generate_series(1, %s) AS g",
            [count],
        )
        # The commit record goes after this position (the server may confirm a keepalive's position
        # inside the transaction while it decodes it: the whole transaction still comes again after that).
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        before_commit = parse_lsn(row[0]) if row else 0
    holder: list[object] = []
    sink = _SlowSink(holder)
    confirmed_midway = []
    async with running(url, slot, sink, batch_size=100) as relay:
        holder.append(relay)
        while len(sink.delivered) < count:
            if 0 < len(sink.delivered) < count - 1000:
                confirmed_midway.append(confirmed_lsn(url, slot))
            await asyncio.sleep(0.2)
        await until(lambda: parse_lsn(confirmed_lsn(url, slot) or "0/0") > before_commit)
    # Partly done: not confirmed (no position at or past the commit), and it did not move meanwhile.
    assert confirmed_midway and len(set(confirmed_midway)) == 1
    assert all(parse_lsn(lsn or "0/0") <= before_commit for lsn in confirmed_midway)
    assert sink.most_in_flight <= relay.log.leader.window_events
    assert relay.log.leader.window_events < count // 2
    for key in {e.key for e in sink.delivered}:
        ns = [_n(e) for e in sink.delivered if e.key == key]
        assert ns == sorted(ns)
    await asyncio.sleep(0)
    assert not _outbox_rows(url)


@synchronous
async def test_a_broker_outage_stops_the_confirm_and_delivery_resumes_after_it(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    sink = MemorySink()
    async with running(url, slot, sink):
        await until(caught_up(url, slot))
        before = confirmed_lsn(url, slot)
        sink.available = False
        with psycopg.connect(url) as conn:
            for n in range(5):
                _insert(conn, "t", "k", {"n": n})
                _message(conn, {"topic": "t", "key": "k", "payload": {"n": n + 5}})
        await asyncio.sleep(2.0)
        assert confirmed_lsn(url, slot) == before
        assert len(_outbox_rows(url)) == 5
        sink.available = True
        await until(lambda: len(sink.delivered) >= 10, timeout=30)
        await until(caught_up(url, slot))
    assert sorted(_n(e) for e in sink.delivered) == list(range(10))
    assert [_n(e) for e in sink.delivered] == [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]
    assert not _outbox_rows(url)


@synchronous
async def test_a_failing_event_is_retried_with_backoff_then_dead_lettered_its_key_waiting(
    log_database: tuple[str, str],
) -> None:
    url, slot = log_database
    with psycopg.connect(url) as conn:
        _message(conn, {"topic": "t", "key": "x", "payload": {"n": 0, "flaky": True}})
        _message(conn, {"topic": "t", "key": "x", "payload": {"n": 1}})
        _insert(conn, "t", "y", {"n": 2})
    sink = MemorySink(fail=lambda e: Failure("broker said no") if b"flaky" in e.payload else None)
    async with running(url, slot, sink, max_attempts=3):
        await until(lambda: [s for _, s, _, _ in _outbox_rows(url)] == ["failed", "pending"], timeout=30)
        await until(caught_up(url, slot))
    assert [_n(e) for e in sink.attempted] == [0, 2, 0, 0]  # x's next event never tried behind it; y went on
    assert [_n(e) for e in sink.delivered] == [2]
    (_, _, key, error), (_, _, parked_key, parked) = _outbox_rows(url)
    assert key == parked_key == "x"
    assert "broker said no (after 3 attempts)" in str(error) and "parked" in str(parked)


@synchronous
async def test_a_retry_keeps_its_key_in_order_across_batches_in_flight(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    with psycopg.connect(url) as conn:
        for n in range(6):
            _message(conn, {"topic": "t", "key": "k", "payload": {"n": n}})
    failed: set[int] = set()

    def once(event: Event) -> Failure | None:
        n = _n(event)
        if n in (0, 3) and n not in failed:
            failed.add(n)
            return Failure("not now")
        return None

    sink = MemorySink(fail=once)
    # One event a batch, several batches in flight: the ones after a failure come back held, after later
    # events of the key were already set aside behind it.
    async with running(url, slot, sink, batch_size=1, pipeline_depth=4, max_attempts=5):
        await until(lambda: len(sink.delivered) >= 6, timeout=30)
    assert [_n(e) for e in sink.delivered] == list(range(6))


@synchronous
async def test_one_keys_retries_do_not_stop_the_other_keys_when_its_events_fill_the_window(
    log_database: tuple[str, str],
) -> None:
    # The window holds 1,000 events (batch_size 100): key a's failing first event, then 1,500 more of a,
    # then b's. Before, a's events held behind its retry filled the window and b was never read.
    url, slot = log_database
    with psycopg.connect(url) as conn:
        _insert(conn, "t", "a", {"n": 0, "flaky": True})
        conn.execute(
            "INSERT INTO outbox (topic, key, payload) SELECT 't', 'a', jsonb_build_object('n', g)"
            " FROM generate_series(1, 1500) AS g"
        )
        for n in range(5):
            _insert(conn, "t", "b", {"n": n})
    failing = [True]
    sink = MemorySink(fail=lambda e: Failure("not yet") if failing[0] and b"flaky" in e.payload else None)
    async with running(url, slot, sink, max_attempts=1000, backoff_initial_seconds=0.5, backoff_max_seconds=0.5):
        await until(lambda: sum(e.key == "b" for e in sink.delivered) == 5, timeout=15)
        assert not any(e.key == "a" for e in sink.delivered)  # a waits behind its first event, in memory
        failing[0] = False
        await until(lambda: len(sink.delivered) == 1506, timeout=20)
        await until(caught_up(url, slot))
    assert [_n(e) for e in sink.delivered if e.key == "a"] == list(range(1501))
    assert not _outbox_rows(url)


@synchronous
async def test_delivery_goes_on_while_the_confirms_delete_waits_on_a_lock(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    with psycopg.connect(url, autocommit=True) as conn:
        _insert(conn, "t", "a", {"n": 1})
    sink = MemorySink()
    with psycopg.connect(url) as locker:  # holds the first row: the confirm's delete of it waits
        locker.execute("SELECT id FROM outbox FOR UPDATE")
        async with running(url, slot, sink):
            await until(lambda: len(sink.delivered) == 1)
            await until(lambda: _deletes_waiting(url) == 1)
            with psycopg.connect(url, autocommit=True) as conn:
                _insert(conn, "t", "b", {"n": 2})
            await until(lambda: len(sink.delivered) == 2, timeout=5.0)
            assert _deletes_waiting(url) == 1  # delivered while the confirm still waited
            locker.rollback()
            await until(lambda: _outbox_rows(url) == [])


def _deletes_waiting(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%DELETE FROM%'"
        ).fetchone()
    assert row is not None
    return int(row[0])


@synchronous
async def test_a_poison_while_the_confirms_delete_waits_on_a_lock_is_dead_lettered_once_it_is_free(
    log_database: tuple[str, str],
) -> None:
    """The dead letter shares the table link with the confirm's delete, which a writer's row lock holds:
    other keys go on meanwhile, and once the lock is gone the poison is a dead letter its key waits behind."""
    url, slot = log_database
    with psycopg.connect(url, autocommit=True) as conn:
        _insert(conn, "t", "a", {"n": 1})
    sink = MemorySink(fail=lambda e: Failure("refused", permanent=True) if b"poison" in e.payload else None)
    with psycopg.connect(url) as locker:
        locker.execute("SELECT id FROM outbox FOR UPDATE")
        async with running(url, slot, sink):
            await until(lambda: len(sink.delivered) == 1)
            await until(lambda: _deletes_waiting(url) == 1)
            with psycopg.connect(url, autocommit=True) as conn:
                _insert(conn, "t", "bad", {"n": 2, "poison": True})
                _insert(conn, "t", "bad", {"n": 3})
                _insert(conn, "t", "c", {"n": 4})
            await until(lambda: any(e.key == "c" for e in sink.delivered), timeout=5.0)
            locker.rollback()
            await until(lambda: [(r[0], r[1]) for r in _states(url)] == [("bad", "failed"), ("bad", "pending")])
            assert [e.key for e in sink.delivered] == ["a", "c"]  # n=3 waits behind its dead letter


def _states(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [(k, s) for k, s in conn.execute("SELECT key, state FROM outbox ORDER BY id").fetchall()]


#: Envelopes written with plain SQL whose text PostgreSQL could not store: escapes of a lone surrogate or a
#: NUL (in the payload, a key, a header, the topic), and a surrogate's raw bytes through the bytea variant.
UNFIT_ENVELOPES = [
    '{"topic": "orders", "key": "a", "payload": {"\\ud800": 1}}',
    '{"topic": "orders", "key": "a", "payload": "x\\u0000"}',
    '{"topic": "orders", "key": "\\udfff", "payload": 1}',
    '{"topic": "orders", "key": "b", "payload": 1, "headers": {"h": "\\u0000"}}',
    '{"topic": "orders\\u0000", "payload": 1}',
]


@synchronous
async def test_envelopes_postgresql_could_not_store_are_dead_lettered_and_the_rest_flows(
    log_database: tuple[str, str],
) -> None:
    url, slot = log_database
    with psycopg.connect(url, autocommit=True) as conn:
        for n, text in enumerate(UNFIT_ENVELOPES):
            conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s::text)", [text])
            _message(conn, {"topic": "orders", "key": "a", "payload": {"n": n}})
        conn.execute("SELECT pg_logical_emit_message(true, 'outbox', '\\x7b22746f706963223a22eda080227d'::bytea)")
        _message(conn, {"topic": "orders", "key": "b", "payload": {"n": 99}})
    sink = MemorySink()
    async with running(url, slot, sink):
        await until(lambda: len(sink.delivered) >= len(UNFIT_ENVELOPES) + 1)
        await until(lambda: len(_outbox_rows(url)) >= len(UNFIT_ENVELOPES) + 1)
        await asyncio.sleep(0.3)
    assert [_n(e) for e in sink.delivered] == [*range(len(UNFIT_ENVELOPES)), 99]
    rows = _outbox_rows(url)
    assert len(rows) == len(UNFIT_ENVELOPES) + 1
    assert all(state == "failed" and key is None and "envelope" in str(error) for _, state, key, error in rows)
