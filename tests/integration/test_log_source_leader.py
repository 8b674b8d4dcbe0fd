"""One reader per slot: standbys wait, take over when the leader ends; a leader that lost its lock confirms
nothing; migrate's refusals."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import psycopg

from devservers.postgres import LOGICAL_DECODING, embedded_postgres
from relay.sinks.memory import MemorySink
from relay.sources.log.publication import prepare
from relay.sources.log.slot import TableLink, lock_key
from relay.store.migrate import migrate
from tests.log_support import TABLE, caught_up, confirmed_lsn, running, synchronous, until


def _write(url: str, first: int, count: int) -> None:
    with psycopg.connect(url) as conn:
        for n in range(first, first + count):
            conn.execute(
                "SELECT pg_logical_emit_message(true, 'outbox', %s)", [json.dumps({"topic": "t", "payload": n})]
            )


def _numbers(sink: MemorySink) -> list[int]:
    return [int(e.payload) for e in sink.delivered]


@synchronous
async def test_a_standby_waits_then_takes_over_with_no_loss(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    _write(url, 0, 10)
    first, second = MemorySink(), MemorySink()
    async with running(url, slot, first) as leader:
        await until(lambda: len(first.delivered) >= 10)
        async with running(url, slot, second) as standby:
            await asyncio.sleep(1.5)
            assert leader.state.leading and not standby.state.leading
            assert second.delivered == []
            done = caught_up(url, slot)
            await until(done)
            _write(url, 10, 5)
            await until(lambda: len(first.delivered) >= 15)
            # The leader goes; the standby takes over within seconds and reads on.
            await asyncio.wait_for(_stop(leader), 30)
            _write(url, 15, 5)
            await until(lambda: len(second.delivered) >= 5, timeout=20)
    assert _numbers(first) == list(range(15))
    assert _numbers(second)[-5:] == list(range(15, 20))


async def _stop(relay: object) -> None:
    # The running() block owns the task; ending the leader's session is what a crash looks like to the server.
    leader = relay.log.leader  # type: ignore[attr-defined]
    await leader.link.close()
    stream = leader.stream
    if stream is not None:
        await stream.close()


@synchronous
async def test_a_leader_whose_lock_was_taken_confirms_nothing(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    sink = MemorySink()
    async with running(url, slot, sink) as relay:
        await until(lambda: relay.state.leading)
        await until(caught_up(url, slot))
        # Its lock's session ends (as a frozen leader's does past idle_session_timeout) and another takes the lock.
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted")
            while not other.execute("SELECT pg_try_advisory_lock(%s)", [lock_key(slot)]).fetchone()[0]:  # type: ignore[index]
                await asyncio.sleep(0.01)
            # From the takeover on (a confirm already past its fence when the session ended may still land:
            # it confirms only what was delivered, and the idle server's keepalives move on meanwhile).
            await asyncio.sleep(0.5)
            before = confirmed_lsn(url, slot)
            _write(url, 0, 3)
            await asyncio.sleep(3.0)
            assert confirmed_lsn(url, slot) == before
            assert not relay.state.leading
        # The lock is free again: the relay leads and delivers.
        await until(lambda: len(sink.delivered) >= 3, timeout=30)
    assert sorted(_numbers(sink))[-3:] == [0, 1, 2]


def test_migrate_refuses_a_server_without_logical_decoding(empty_database: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "relay", "migrate", "--database-url", empty_database, "--source", "log", "--slot", "s1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "wal_level = logical" in lines[0], run.stderr
    with psycopg.connect(empty_database) as conn:  # and wrote nothing
        assert conn.execute("SELECT to_regclass('outbox')").fetchone() == (None,)


def test_migrate_twice_is_safe(logical_server: str, log_database: tuple[str, str]) -> None:
    url, slot = log_database
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-m", "relay", "migrate", "--database-url", url, "--source", "log", "--slot", slot],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stderr
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT pubinsert, pubupdate, pubdelete FROM pg_publication WHERE pubname = %s", [slot]
        ).fetchone()
    assert row == (True, False, False)


@synchronous
async def test_a_dropped_slot_fails_healthz_and_status_says_so(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    sink = MemorySink()
    async with running(url, slot, sink) as relay:
        await until(lambda: relay.state.leading)
        assert relay.alive()
        status = subprocess.run(
            [sys.executable, "-m", "relay", "status", "--json", "--database-url", url, "--slot", slot],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert json.loads(status.stdout)["slot"]["exists"] is True
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(100):  # the reader comes back at once: end it until the drop gets in
                conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s"
                             " AND active_pid IS NOT NULL", [slot])  # fmt: skip
                try:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])
                    break
                except psycopg.errors.ObjectInUse:
                    await asyncio.sleep(0.05)
        await until(lambda: not relay.alive(), timeout=30)
        assert relay.state.gone is not None and slot in relay.state.gone
        assert b'outbox_relay_slot_wal_status{status="missing"} 1.0' in relay.metrics.render()
    status = subprocess.run(
        [sys.executable, "-m", "relay", "status", "--database-url", url, "--slot", slot],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "slot exists: False" in status.stdout


@synchronous
async def test_an_invalidated_slot_fails_healthz_with_the_reason() -> None:
    with embedded_postgres({**LOGICAL_DECODING, "max_slot_wal_keep_size": "1MB"}) as url:
        migrate(url, TABLE)
        prepare(url, TABLE, "tiny")
        sink = MemorySink()
        async with running(url, "tiny", sink) as relay:
            await until(lambda: relay.state.leading)
            with psycopg.connect(url, autocommit=True) as conn:
                for _ in range(4):  # the reader cut off each time: the WAL the slot holds passes 1 MB
                    conn.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots")
                    conn.execute("CREATE TABLE IF NOT EXISTS filler (x int); INSERT INTO filler VALUES (1)")
                    conn.execute("SELECT pg_switch_wal()")
                conn.execute("CHECKPOINT")
                assert conn.execute("SELECT wal_status FROM pg_replication_slots").fetchone() == ("lost",)
            await until(lambda: not relay.alive(), timeout=30)
            assert relay.state.gone is not None and "invalidated" in relay.state.gone
            assert b'outbox_relay_slot_wal_status{status="lost"} 1.0' in relay.metrics.render()


@synchronous
async def test_the_slot_advances_past_a_busy_neighbours_wal_on_an_idle_database(
    log_database: tuple[str, str], logical_server: str
) -> None:
    url, slot = log_database
    async with running(url, slot, MemorySink()) as relay:
        await until(lambda: relay.state.leading)
        with psycopg.connect(logical_server, autocommit=True) as neighbour:
            neighbour.execute("CREATE TABLE IF NOT EXISTS neighbour_filler (x text)")
            neighbour.execute("INSERT INTO neighbour_filler SELECT repeat('x', 100) FROM generate_series(1, 20000)")
        # Nothing of ours in that WAL, yet the slot confirms past it: it holds none of it back.
        await until(caught_up(url, slot), timeout=30)


@synchronous
async def test_the_fenced_delete_deletes_only_while_the_session_holds_the_slots_lock(
    log_database: tuple[str, str],
) -> None:
    url, slot = log_database
    with psycopg.connect(url, autocommit=True) as conn:
        ids = [row[0] for row in conn.execute(
            "INSERT INTO outbox (topic, payload) SELECT 't', '{}' FROM generate_series(1, 3) RETURNING id"
        )]  # fmt: skip
    link = TableLink(url, TABLE, slot, leader_timeout_seconds=10.0)
    await link.connect(5.0)
    try:
        assert not await link.fence_and_delete(ids[:2])  # not the leader: nothing goes
        assert await link.try_lead()
        assert await link.fence_and_delete(ids[:2])
    finally:
        await link.close()
    with psycopg.connect(url) as conn:
        assert [row[0] for row in conn.execute("SELECT id FROM outbox")] == ids[2:]
