"""The slot's reader under a stall: a leader frozen inside its one transaction still loses the slot within the
leader timeout, and a slow publish of an event handed over to the table neither costs the leadership nor
stops the confirm of the other keys' events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import psycopg

from relay.config import RelaySettings
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.log_relay import LogRelay
from relay.sinks.memory import MemorySink
from relay.sources.log.publication import prepare
from relay.store.migrate import migrate
from tests.log_support import (
    TABLE,
    caught_up,
    confirmed_lsn,
    new_database,
    running,
    settings,
    synchronous,
    until,
)

#: A short leader timeout keeps the tests quick (the session's and the stream's idle bounds; above the 2 s between
#: status updates).
LEADER_TIMEOUT_SECONDS = 4.0


def _insert(url: str, rows: Sequence[tuple[str | None, object]]) -> None:
    with psycopg.connect(url) as conn:
        for key, payload in rows:
            conn.execute(
                "INSERT INTO outbox (topic, key, payload) VALUES ('t', %s, %s::jsonb)", [key, json.dumps(payload)]
            )


class _Relays:
    """Log relays on one slot, each in a task, stopped together."""

    def __init__(self, url: str, slot: str, relay_settings: RelaySettings) -> None:
        self.url, self.slot, self.settings = url, slot, relay_settings
        self.running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    def start(self, sink: Any) -> LogRelay:
        relay = LogRelay(self.url, TABLE, self.slot, sink, self.settings, leader_timeout_seconds=LEADER_TIMEOUT_SECONDS)
        stop = asyncio.Event()
        self.running.append((stop, asyncio.create_task(relay.run(stop))))
        return relay

    async def stop(self) -> None:
        for stop, _ in self.running:
            stop.set()
        await asyncio.wait([task for _, task in self.running], timeout=20)
        for _, task in self.running:
            task.cancel()
        await asyncio.gather(*(task for _, task in self.running), return_exceptions=True)


class _FrozenInTransaction:
    """A connection whose owner freezes after the DELETE of a park's transaction, before its INSERT: to the
    server, a process stopped (or cut off) with the transaction open."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn
        self.frozen = asyncio.Event()
        #: Set when the process wakes up: it goes on where it stopped.
        self.woken = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def execute(self, query: Any, params: Any = None) -> Any:
        text = query.as_string(self._conn) if hasattr(query, "as_string") else str(query)
        if self._conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS and text.lstrip().startswith(
            "INSERT"
        ):
            self.frozen.set()
            await self.woken.wait()
        return await self._conn.execute(query, params)


@synchronous
async def test_a_leader_frozen_inside_its_park_transaction_is_taken_over_within_seconds(
    log_database: tuple[str, str],
) -> None:
    url, slot = log_database
    relays = _Relays(url, slot, settings(max_attempts=1))
    sink = MemorySink(fail=lambda e: Failure("refused", permanent=True) if b"poison" in e.payload else None)
    frozen: _FrozenInTransaction | None = None
    try:
        first = relays.start(sink)
        await until(lambda: first.state.leading)
        link = first.log.leader.link
        frozen = _FrozenInTransaction(link._conn)  # type: ignore[arg-type]
        link._conn = frozen  # type: ignore[assignment]
        second_sink = MemorySink()
        second = relays.start(second_sink)
        await asyncio.sleep(1.5)
        assert not second.state.leading
        # A dead letter parks its key; the key's next event is handed over to the table, in one transaction.
        _insert(url, [("bad", {"n": 0, "poison": True}), ("bad", {"n": 1})])
        await until(frozen.frozen.is_set)
        # The frozen leader's session is idle (in its transaction) from now on: past the leader timeout, a
        # standby leads the slot, and delivers.
        await until(lambda: second.state.leading, timeout=LEADER_TIMEOUT_SECONDS + 8.0)
        _insert(url, [("good", {"n": 2})])
        await until(lambda: any(e.key == "good" for e in second_sink.delivered), timeout=15)
        # The frozen one wakes: its transaction was ended with its session, so nothing of it lands.
        frozen.woken.set()
        await asyncio.sleep(1.0)
        assert not first.state.leading and second.state.leading
    finally:
        if frozen is not None:
            frozen.woken.set()
        await relays.stop()


class _SlowForHandedOver(MemorySink):
    """A broker that answers the events handed over to the table slowly (within the publish timeout)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        if any(e.key == "requeued" for e in events):
            await asyncio.sleep(self.seconds)
        return await super().publish(events, holds)


@synchronous
async def test_a_slow_publish_of_a_handed_over_event_does_not_stop_the_confirm_of_the_others(
    log_database: tuple[str, str],
) -> None:
    url, slot = log_database
    # A dead letter requeued by an operator: the leader delivers it from the table.
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state, last_error)"
            " VALUES ('t', 'requeued', '{\"n\": -1}', 'pending', 'refused')"
        )
    # It takes the broker longer than the leader timeout to answer it, well within the publish timeout.
    sink = _SlowForHandedOver(LEADER_TIMEOUT_SECONDS * 1.5)
    relays = _Relays(url, slot, settings(publish_timeout_seconds=10.0))
    try:
        relay = relays.start(sink)
        await until(lambda: relay.state.leading)
        _insert(url, [(f"k{n % 3}", {"n": n}) for n in range(5)])
        done = caught_up(url, slot)
        await until(lambda: len([e for e in sink.delivered if e.key != "requeued"]) >= 5)
        # The other keys' events are confirmed, and delivered once: the leadership was not lost meanwhile.
        await until(done, timeout=LEADER_TIMEOUT_SECONDS * 8)
        await until(lambda: any(e.key == "requeued" for e in sink.delivered), timeout=15)
        others = [json.loads(e.payload)["n"] for e in sink.delivered if e.key != "requeued"]
        assert sorted(others) == list(range(5)), others
        assert confirmed_lsn(url, slot) is not None
    finally:
        await relays.stop()


@synchronous
async def test_rows_pending_before_the_slot_was_made_are_delivered(logical_server: str) -> None:
    # A table relay's backlog when its operator moves to the log source: rows the slot never streams. They
    # are handed over to the table when the slot is made, and each key's later events wait behind them.
    with new_database(logical_server) as (url, slot):
        migrate(url, TABLE)
        _insert(url, [("a", {"n": 0}), ("b", {"n": 1}), (None, {"n": 2}), ("a", {"n": 3})])
        with psycopg.connect(url, autocommit=True) as conn:  # a dead letter stays one, and a sent row is no event
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, state, last_error) VALUES ('t', 'c', '{}', 'failed', 'x')"
            )
            conn.execute("INSERT INTO outbox (topic, key, payload, state) VALUES ('t', 'd', '{}', 'sent')")
        assert "4 events written before the slot, handed over to the table" in prepare(url, TABLE, slot)
        _insert(url, [("a", {"n": 4}), ("b", {"n": 5}), ("e", {"n": 6})])
        assert prepare(url, TABLE, slot) == []  # again: the rows since are streamed, not handed over
        sink = MemorySink()
        async with running(url, slot, sink):
            await until(lambda: len({json.loads(e.payload)["n"] for e in sink.delivered}) >= 7, timeout=20)
        arrived = [json.loads(e.payload)["n"] for e in sink.delivered]
        assert set(arrived) == set(range(7))
        firsts = list(dict.fromkeys(arrived))
        assert firsts.index(0) < firsts.index(3) < firsts.index(4) and firsts.index(1) < firsts.index(5)
        with psycopg.connect(url) as conn:
            left = conn.execute("SELECT key, state FROM outbox WHERE state <> 'sent' ORDER BY id").fetchall()
        assert left == [("c", "failed")]


@synchronous
async def test_the_stream_outlives_a_confirms_delete_waiting_on_a_writers_lock(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    _insert(url, [("a", {"n": 0})])
    sink = MemorySink()
    relays = _Relays(url, slot, settings())
    try:
        with psycopg.connect(url) as locker:  # a writer holds the first row: the confirm's delete of it waits
            locker.execute("SELECT id FROM outbox FOR UPDATE")
            relay = relays.start(sink)
            await until(lambda: len(sink.delivered) == 1)
            # Longer than the stream's idle bound, well within the statement timeout.
            await asyncio.sleep(LEADER_TIMEOUT_SECONDS * 1.5)
            _insert(url, [("b", {"n": 1})])
            await until(lambda: len(sink.delivered) == 2)
            locker.rollback()
        await until(caught_up(url, slot), timeout=15)
        await asyncio.sleep(1.0)
        # Read once: the leadership (and its stream) held throughout, so nothing was read and delivered again.
        assert [json.loads(e.payload)["n"] for e in sink.delivered] == [0, 1]
        assert relay.state.leading
    finally:
        await relays.stop()


@synchronous
async def test_a_graceful_stop_ends_the_reader_at_once(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    _insert(url, [("a", {"n": 0}), ("b", {"n": 1, "failing": True})])
    # An event never acknowledged: the last confirm moves nothing, and asks the server for an answer.
    sink = MemorySink(fail=lambda e: Failure("down") if b"failing" in e.payload else None)
    loop = asyncio.get_running_loop()
    for _ in range(4):
        async with running(url, slot, sink, max_attempts=1000):
            await until(lambda: any(e.key == "a" for e in sink.delivered))
            await asyncio.sleep(0.5)
            stopping = loop.time()
        # The reader's cancel must not be lost: the stop would wait for the stream to end as silent.
        assert loop.time() - stopping < 5.0
