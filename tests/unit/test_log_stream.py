"""The replication stream's reads: a backlog already in the socket is read without a wait on the socket, and
every read still lets the event loop's other tasks run (the deliverer, the confirm)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections import deque

import pytest

from relay.sources.log.stream import ReplicationStream


class _Conn:
    """libpq as the stream sees it: frames in its buffer, more in the socket until ``consume_input``."""

    def __init__(self, socket_holds: list[bytes]) -> None:
        self.buffer: deque[bytes] = deque()
        self.socket_holds = socket_holds
        self.socket = -1

    def get_copy_data(self, _async: int) -> tuple[int, bytes]:
        if self.buffer:
            frame = self.buffer.popleft()
            return len(frame), frame
        return 0, b""

    def consume_input(self) -> None:
        self.buffer.extend(self.socket_holds)
        self.socket_holds = []


def _stream(conn: _Conn) -> ReplicationStream:
    stream = ReplicationStream("postgresql://unused", "slot", "publication", sender_timeout_seconds=60.0)
    stream._pg = conn  # type: ignore[assignment]
    return stream


@pytest.mark.timeout(10)
def test_frames_already_in_the_socket_are_read_without_a_wait_on_the_socket() -> None:
    stream = _stream(_Conn([b"w1", b"w2"]))

    async def no_wait(timeout: float) -> None:
        raise AssertionError("waited on the socket for frames it had already")

    stream._readable = no_wait  # type: ignore[method-assign]
    assert asyncio.run(stream.read_frames(1.0, 100)) == [b"w1", b"w2"]


@pytest.mark.timeout(10)
def test_a_read_of_frames_already_in_the_socket_lets_the_other_tasks_run_first() -> None:
    stream = _stream(_Conn([b"w1"]))

    async def scenario() -> list[str]:
        ran: list[str] = []

        async def other() -> None:
            ran.append("other task")

        task = asyncio.create_task(other())
        frames = await stream.read_frames(1.0, 100)
        ran.append(f"read {len(frames)}")
        await task
        return ran

    assert asyncio.run(scenario()) == ["other task", "read 1"]


@pytest.mark.timeout(10)
def test_with_nothing_in_the_socket_a_read_waits_on_it_then_gives_up_at_its_timeout() -> None:
    stream = _stream(_Conn([]))
    waits: list[float] = []

    async def wait(timeout: float) -> None:
        waits.append(timeout)
        await asyncio.sleep(timeout)

    stream._readable = wait  # type: ignore[method-assign]
    assert asyncio.run(stream.read_frames(0.05, 100)) == []
    assert waits and waits[0] == pytest.approx(0.05, abs=0.02)


@pytest.mark.timeout(10)
def test_a_wait_on_the_socket_cancelled_as_the_socket_turns_readable_ends_cancelled() -> None:
    """The leader cancels its reader at a leadership's end, often just as the server answers the last confirm:
    a lost cancel left the reader reading, and the stop waiting for the stream to end as silent."""
    ours, server = socket.socketpair()
    twin = os.dup(ours.fileno())  # the same socket under another descriptor: readable in the same turn
    conn = _Conn([])
    conn.socket = ours.fileno()
    stream = _stream(conn)

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        waiting = asyncio.create_task(stream._readable(5.0))
        await asyncio.sleep(0)  # it waits on the socket
        loop.add_reader(twin, waiting.cancel)
        server.send(b"k")
        try:
            await waiting
        except asyncio.CancelledError:
            return True
        finally:
            loop.remove_reader(twin)
        return False

    try:
        assert asyncio.run(scenario()), "the cancel was lost: the wait returned as if the socket had only turned ready"
    finally:
        os.close(twin)
        ours.close()
        server.close()
