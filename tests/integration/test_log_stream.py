"""The replication stream's reads on a real walsender (embedded PostgreSQL, wal_level=logical): a backlog read
whole and in order whatever the batch limit, an idle stream that waits on its socket instead of spinning, and a
walsender ended under a waiting read that raises at once."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from relay.errors import StoreUnavailable
from relay.sources.log.pgoutput import Message, parse_frame, parse_message
from relay.sources.log.publication import publication_name
from relay.sources.log.stream import ReplicationStream
from tests.log_support import synchronous

#: Messages committed one a transaction, then as many more in one transaction.
BACKLOG = 600


async def _started(url: str, slot: str) -> ReplicationStream:
    stream = ReplicationStream(url, slot, publication_name(slot), sender_timeout_seconds=60.0)
    await stream.start(10.0)
    return stream


async def _caught_up(url: str, slot: str) -> ReplicationStream:
    """A started stream that has read what the slot held before: nothing new comes after."""
    stream = await _started(url, slot)
    while await stream.read_frames(0.5, 100):
        pass
    return stream


def _numbers(frames: list[bytes]) -> list[int]:
    """The numbers the frames' messages carry, in the order read (keepalives and begin/commit skipped)."""
    numbers = []
    for frame in frames:
        parsed = parse_frame(frame)
        if isinstance(parsed, tuple) and isinstance(message := parse_message(parsed[1]), Message):
            numbers.append(int(message.content))
    return numbers


@synchronous
async def test_a_backlog_is_read_whole_and_in_order_in_batches_of_any_size(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(BACKLOG):
            conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s::text)", [str(n)])
        with conn.transaction():
            for n in range(BACKLOG, 2 * BACKLOG):
                conn.execute("SELECT pg_logical_emit_message(true, 'outbox', %s::text)", [str(n)])
    stream = await _started(url, slot)
    try:
        numbers: list[int] = []
        deadline = time.monotonic() + 30
        while len(numbers) < 2 * BACKLOG and time.monotonic() < deadline:
            numbers += _numbers(await stream.read_frames(1.0, 37))  # a limit that splits buffers and transactions
    finally:
        await stream.close()
    assert numbers == list(range(2 * BACKLOG))


@pytest.mark.timeout(60)
@synchronous
async def test_an_idle_stream_waits_on_its_socket_without_spinning(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    stream = await _caught_up(url, slot)
    try:
        cpu, wall = time.thread_time(), time.monotonic()
        # Reads for 3 s: a read may end before its timeout on a keepalive (the walsender sends them while idle).
        while time.monotonic() - wall < 3.0:
            assert _numbers(await stream.read_frames(0.5, 100)) == []
        cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
    finally:
        await stream.close()
    assert cpu < 0.3, f"{cpu:.3f} s of CPU in {wall:.1f} s of idle reads"  # a spinning read: about all of it


@pytest.mark.timeout(60)
@synchronous
async def test_a_walsender_ended_under_a_waiting_read_raises_at_once(log_database: tuple[str, str]) -> None:
    url, slot = log_database
    stream = await _caught_up(url, slot)
    try:

        async def read_on() -> None:
            # A frame the walsender sends before it ends (a keepalive) ends a read without an error: read on.
            while True:
                await stream.read_frames(20.0, 100)

        reading = asyncio.create_task(read_on())
        await asyncio.sleep(0.3)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s", [slot]
            )
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(reading, 10.0)
        assert time.monotonic() - started < 5.0
    finally:
        await stream.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        await stream.read_frames(0.1, 100)
