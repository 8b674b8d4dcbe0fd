"""The replication connection: ``START_REPLICATION`` on a ``replication=database`` connection.

psycopg 3 starts the stream (a COPY_BOTH result) and parses none of it: frames
are read raw with ``get_copy_data`` and status updates written with
``put_copy_data``, waiting on the socket with the event loop. Reading stops
while the caller does not ask for more: the server then waits on the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import psycopg
from psycopg import pq

from relay.errors import StoreUnavailable
from relay.sources.log.pgoutput import Keepalive, parse_frame, standby_status

#: The session settings pgoutput's text output depends on, and how soon the server drops a silent reader.
STREAM_OPTIONS = "-c datestyle=ISO -c timezone=UTC -c bytea_output=hex -c extra_float_digits=3"


class SlotBusy(StoreUnavailable):
    """Another process reads the slot ("replication slot ... is active for PID ...")."""


class SlotMissing(StoreUnavailable):
    """The slot does not exist, or can no longer be read (invalidated)."""


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class ReplicationStream:
    """One slot's stream of frames, read on demand, with status updates sent as asked."""

    def __init__(self, dsn: str, slot: str, publication: str, *, sender_timeout_seconds: float) -> None:
        self._dsn = dsn
        self._slot = slot
        self._publication = publication
        self._sender_timeout = sender_timeout_seconds
        self._conn: psycopg.AsyncConnection[object] | None = None
        self._pg: pq.abc.PGconn | None = None
        self.last_status_at = 0.0
        #: The highest position sent in a status update (0 before the first).
        self.sent = 0

    async def start(self, connect_timeout: float) -> None:
        """Connect and start streaming from the slot's confirmed position."""
        options = f"{STREAM_OPTIONS} -c wal_sender_timeout={int(self._sender_timeout * 1000)}"
        try:
            self._conn = await psycopg.AsyncConnection.connect(
                self._dsn,
                replication="database",
                autocommit=True,
                connect_timeout=max(1, round(connect_timeout)),
                options=options,
            )
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot open a replication connection: {exc}") from None
        pg = self._pg = self._conn.pgconn
        command = (
            f"START_REPLICATION SLOT {_quote(self._slot)} LOGICAL 0/0 (proto_version '1', "
            f"publication_names '{self._publication.replace(chr(39), chr(39) * 2)}', messages 'true')"
        )
        try:
            pg.send_query(command.encode())
            await self._flush()
            deadline = time.monotonic() + connect_timeout
            while True:
                pg.consume_input()
                if not pg.is_busy():
                    break
                await self._readable(deadline - time.monotonic())
        except TimeoutError:
            await self.close()
            raise StoreUnavailable("START_REPLICATION got no answer in time") from None
        except BaseException:
            await self.close()  # cancelled, or the connection failed: it is not left open
            raise
        result = pg.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = (result.error_message.decode(errors="replace").strip() if result is not None else "") or "?"
            await self.close()
            if "is active for PID" in message:
                raise SlotBusy(message)
            if "does not exist" in message or "invalidated" in message or "cannot" in message:
                raise SlotMissing(f"slot {self._slot}: {message}")
            raise StoreUnavailable(f"START_REPLICATION failed: {message}")

    async def read(self, timeout: float) -> tuple[int, bytes] | Keepalive | None:
        """The next frame, parsed, or None if none came within ``timeout`` seconds."""
        frames = await self.read_frames(timeout, 1)
        return parse_frame(frames[0]) if frames else None

    async def read_frames(self, timeout: float, limit: int) -> list[bytes]:
        """The frames already received, ``limit`` at most, raw; waits up to ``timeout`` seconds for the first
        (an empty list if none came). One wait on the socket serves every frame it brought."""
        pg = self._pg
        if pg is None:
            raise StoreUnavailable("the replication stream is closed")
        frames: list[bytes] = []
        deadline = 0.0
        # Whether the socket was read without a wait since the buffer ran dry (see below).
        read_ahead = False
        get = pg.get_copy_data
        while True:
            try:
                size, data = get(1)
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"replication stream lost: {exc}") from None
            if size > 0:
                frames.append(bytes(data))
                if len(frames) >= limit:
                    return frames
                continue
            if frames:
                return frames
            if size == -1:  # the stream ended: the server said why
                result = pg.get_result()
                message = result.error_message.decode(errors="replace").strip() if result is not None else ""
                if "invalidated" in message or "does not exist" in message:
                    raise SlotMissing(f"slot {self._slot}: {message}")
                raise StoreUnavailable(f"replication stream ended: {message or 'no reason given'}")
            if size != 0:
                raise StoreUnavailable(f"replication stream lost: {pg.error_message.decode(errors='replace')}")
            if not read_ahead:
                # While a backlog streams in, the socket has the next frames already: read them after one turn
                # of the event loop (the others run first, as after a wait), not after a wait on the socket (a
                # reader added, a poll, the reader removed: about twice the cost, for each buffer's worth).
                read_ahead = True
                await asyncio.sleep(0)
                try:
                    pg.consume_input()
                except psycopg.OperationalError as exc:
                    raise StoreUnavailable(f"replication stream lost: {exc}") from None
                continue
            now = time.monotonic()
            if not deadline:
                deadline = now + timeout
            left = deadline - now
            if left <= 0:
                return frames
            with contextlib.suppress(TimeoutError):
                await self._readable(left)
            try:
                pg.consume_input()
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(f"replication stream lost: {exc}") from None

    async def confirm(self, lsn: int, *, reply: bool = False) -> None:
        """Tell the server everything up to ``lsn`` is flushed: the slot's confirmed position."""
        self.sent = lsn = max(self.sent, lsn)
        await self._status(lsn, reply=reply)
        self.last_status_at = time.monotonic()

    async def answer(self) -> None:
        """Answer a keepalive that asks for a reply: the position sent last, again (it moves nothing), so the
        server does not end the stream as silent while the confirms wait on the database. Not a status update
        of the leader's (``last_status_at`` stays): those go on checking the lock every few seconds."""
        await self._status(self.sent, reply=False)

    async def _status(self, lsn: int, *, reply: bool) -> None:
        pg = self._pg
        if pg is None:
            raise StoreUnavailable("the replication stream is closed")
        try:
            pg.put_copy_data(standby_status(lsn, reply=reply))
            await self._flush()
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"replication stream lost: {exc}") from None

    async def close(self) -> None:
        conn, self._conn, self._pg = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _flush(self) -> None:
        pg = self._pg
        assert pg is not None
        while pg.flush():
            await self._writable(5.0)

    async def _readable(self, timeout: float) -> None:
        await self._wait(timeout, write=False)

    async def _writable(self, timeout: float) -> None:
        await self._wait(timeout, write=True)

    async def _wait(self, timeout: float, *, write: bool) -> None:
        pg = self._pg
        if pg is None:
            raise StoreUnavailable("the replication stream is closed")
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        fd = pg.socket

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        (loop.add_writer if write else loop.add_reader)(fd, wake)
        try:
            # Not wait_for: on Python 3.11 it swallows a cancellation that comes as the socket turns ready (the
            # server's answer to the last confirm), and the reader, cancelled at a leadership's end, read on.
            async with asyncio.timeout(max(timeout, 0.0)):
                await ready
        finally:
            (loop.remove_writer if write else loop.remove_reader)(fd)
