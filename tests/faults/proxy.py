"""A TCP proxy that misbehaves on request, for the network fault scenarios.

There is no toxiproxy or netem here, so this stands in: an asyncio server on
its own event loop in a background thread, listening on a free port of
127.0.0.1 and forwarding every connection to an upstream ``host:port``. The
test thread switches the mode at any time; a switch returns once it applies
to every connection, existing and new::

    with FaultProxy("127.0.0.1", 5432) as proxy:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/db"
        proxy.latency(0.1)   # each chunk arrives 100 ms late, both ways
        proxy.latency(3, direction="down")  # only what the server sends is late
        proxy.blackhole()    # accept and read, forward nothing
        proxy.passthrough()  # forward again

Modes:

- ``passthrough()``: forward both ways.
- ``latency(seconds)``: deliver each chunk ``seconds`` after it was read, in
  each direction, order kept (a delay, not a bandwidth cap). With
  ``direction="down"`` only what the server sends is late (acknowledgements
  after the server acted), with ``"up"`` only what the client sends.
- ``blackhole()``: connections stay open and are read, but nothing is
  forwarded; new ones are accepted and stay silent. A byte stream with a hole
  in it cannot go on, so when the black hole ends, every connection that lost
  bytes in it is reset (a real partition that long ends in a TCP timeout too);
  connections that stayed idle carry on.
- ``reset()``: RST every connection (SO_LINGER 0, then close), and every new
  one as soon as it is accepted.
- ``slow_close(seconds)``: stop forwarding; ``seconds`` later send FIN both
  ways (a half-close: what the peers send is still read and dropped), and
  ``seconds`` after that close for good. New connections get the same.
- ``cut()``: close every existing connection now (FIN, or RST with
  ``reset=True``); the mode stays as it is.

Upstream connections are opened when a client connects; if the upstream
refuses, the client is reset, as it would be by the real server being down.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

CHUNK_BYTES = 65536
QUEUE_CHUNKS = 256
SWITCH_TIMEOUT_SECONDS = 10.0
UPSTREAM_CONNECT_TIMEOUT_SECONDS = 5.0

_T = TypeVar("_T")
_FORWARDING = ("pass", "latency")


@dataclass(frozen=True)
class Mode:
    """What the proxy does now; ``seconds`` is the latency or the slow-close step,
    ``direction`` which way a latency applies (``both``, ``up`` or ``down``)."""

    name: str = "pass"
    seconds: float = 0.0
    direction: str = "both"

    def delay(self, direction: str) -> float:
        """How late a chunk read now travels ``direction`` (``up`` or ``down``)."""
        return self.seconds if self.name == "latency" and self.direction in ("both", direction) else 0.0

    @property
    def forwards(self) -> bool:
        return self.name in _FORWARDING


def _set_rst_on_close(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Connection:
    """One client connection, its upstream connection and the two pumps between them."""

    def __init__(self, proxy: FaultProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = (reader, writer)
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        #: Bytes were dropped: the stream cannot be resumed.
        self.poisoned = False
        self.closing = False
        self._eofs = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._slow_close: asyncio.Task[None] | None = None

    @property
    def writers(self) -> list[asyncio.StreamWriter]:
        return [self.client[1]] + ([self.upstream[1]] if self.upstream else [])

    async def run(self) -> None:
        mode = self.proxy.mode_now
        if mode.name == "reset":
            self.close(rst=True)
            return
        if mode.forwards:
            try:
                self.upstream = await asyncio.wait_for(
                    asyncio.open_connection(*self.proxy.upstream), UPSTREAM_CONNECT_TIMEOUT_SECONDS
                )
            except (OSError, TimeoutError):
                self.close(rst=True)
                return
            if self.closing:
                # Reset or cut while connecting: the client end is gone already.
                _set_rst_on_close(self.upstream[1])
                self.upstream[1].transport.abort()
                return
        else:
            # Silent from the start: even if the mode changes, no upstream ever saw this one.
            self.poisoned = True
            if mode.name == "slow_close":
                self.start_slow_close(mode.seconds)
        self._spawn(self._pump(self.client[0], "up"))
        if self.upstream is not None:
            self._spawn(self._pump(self.upstream[0], "down"))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _pump(self, reader: asyncio.StreamReader, direction: str) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(QUEUE_CHUNKS)
        self._spawn(self._deliver(queue, direction))
        try:
            while True:
                data = await reader.read(CHUNK_BYTES)
                mode = self.proxy.mode_now
                if not data:
                    if mode.forwards and not self.poisoned:
                        await queue.put((loop.time() + mode.delay(direction), None))
                    elif self._slow_close is None:
                        self.close()
                    # In a slow close, the peer's FIN changes nothing: the timer ends it.
                    return
                if not mode.forwards or self.poisoned:
                    self.poisoned = True
                    self.proxy.dropped_bytes += len(data)
                    continue
                await queue.put((loop.time() + mode.delay(direction), data))
        except (ConnectionError, OSError):
            self.close(rst=True)

    async def _deliver(self, queue: asyncio.Queue[tuple[float, bytes | None]], direction: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not self.proxy.mode_now.forwards or self.poisoned:
                    # Read before the switch, not yet delivered: dropped with the rest.
                    self.poisoned = True
                    continue
                target = self.upstream[1] if direction == "up" and self.upstream else self.client[1]
                if data is None:
                    self._eofs += 1
                    if self._eofs == 2 or not target.can_write_eof():
                        self.close()
                        return
                    target.write_eof()
                    continue
                target.write(data)
                await target.drain()
                self.proxy.forwarded_bytes += len(data)
        except (ConnectionError, OSError):
            self.close(rst=True)

    def start_slow_close(self, seconds: float) -> None:
        if self._slow_close is None and not self.closing:
            self.poisoned = True
            self._slow_close = asyncio.get_running_loop().create_task(self._close_slowly(seconds))

    async def _close_slowly(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        for writer in self.writers:
            if not writer.is_closing() and writer.can_write_eof():
                with contextlib.suppress(OSError):
                    writer.write_eof()
        await asyncio.sleep(seconds)
        self.close()

    def close(self, *, rst: bool = False) -> None:
        """Close both ends now; with ``rst``, abort them with a reset."""
        if self.closing:
            return
        self.closing = True
        self.proxy.forget(self)
        for writer in self.writers:
            if rst:
                _set_rst_on_close(writer)
                writer.transport.abort()
            else:
                writer.close()
        current = asyncio.current_task()
        for task in [*self._tasks, self._slow_close]:
            if task is not None and task is not current:
                task.cancel()

    async def finish(self) -> None:
        """Wait for the pumps and transports to be gone (after ``close``)."""
        tasks = [t for t in (*self._tasks, self._slow_close) if t is not None and t is not asyncio.current_task()]
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in self.writers:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_host:upstream_port``, faults on request.

    Thread-safe: every method may be called from any thread but the proxy's own.
    """

    def __init__(self, upstream_host: str, upstream_port: int, *, port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = port
        self.mode_now = Mode()
        self.accepted = 0
        self.forwarded_bytes = 0
        self.dropped_bytes = 0
        self._connections: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"fault-proxy-{upstream_port}", daemon=True)

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` to point clients at."""
        return f"127.0.0.1:{self.port}"

    @property
    def mode(self) -> str:
        """The current mode's name: pass, latency, blackhole, reset or slow_close."""
        return self.mode_now.name

    @property
    def connections(self) -> int:
        """Client connections open through the proxy now."""
        return self._call(self._count())

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> FaultProxy:
        """Listen and forward; returns once the port accepts connections."""
        self._thread.start()
        if not self._ready.wait(SWITCH_TIMEOUT_SECONDS):
            raise TimeoutError("the fault proxy did not start")
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def close(self) -> None:
        """Close every connection and the listener, stop the thread. Safe to call twice."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.is_alive():
            self._thread.join(SWITCH_TIMEOUT_SECONDS)
            if self._thread.is_alive():
                raise TimeoutError("the fault proxy did not stop")

    def passthrough(self) -> None:
        """Forward both ways again; connections that lost bytes meanwhile are reset."""
        self._switch(Mode("pass"))

    def latency(self, seconds: float, *, direction: str = "both") -> None:
        """Deliver every chunk ``seconds`` late, in each direction or only ``up`` or ``down``."""
        if seconds < 0:
            raise ValueError("latency must not be negative")
        if direction not in ("both", "up", "down"):
            raise ValueError("direction must be both, up or down")
        self._switch(Mode("latency", seconds, direction))

    def blackhole(self) -> None:
        """Read everything, forward nothing, keep connections open."""
        self._switch(Mode("blackhole"))

    def reset(self) -> None:
        """Reset every connection, now and as soon as new ones are accepted."""
        self._switch(Mode("reset"))

    def slow_close(self, seconds: float = 5.0) -> None:
        """Stop forwarding; half-close after ``seconds``, close after twice that."""
        if seconds < 0:
            raise ValueError("slow-close delay must not be negative")
        self._switch(Mode("slow_close", seconds))

    def cut(self, *, reset: bool = False) -> None:
        """Close every connection now (FIN, or RST with ``reset``); the mode stays."""
        self._call(self._close_all(rst=reset))

    def forget(self, connection: _Connection) -> None:
        """A connection is closing (called on the proxy's loop)."""
        self._connections.discard(connection)

    # Everything below runs on the proxy's loop.

    def _switch(self, mode: Mode) -> None:
        self._call(self._apply(mode))

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        if self._loop is None or not self._thread.is_alive():
            coro.close()
            raise RuntimeError("the fault proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(SWITCH_TIMEOUT_SECONDS)

    async def _count(self) -> int:
        return len(self._connections)

    async def _apply(self, mode: Mode) -> None:
        self.mode_now = mode
        connections = list(self._connections)
        if mode.name == "reset":
            await self._close_all(rst=True)
        elif mode.name == "slow_close":
            for connection in connections:
                connection.start_slow_close(mode.seconds)
        elif mode.forwards:
            broken = [c for c in connections if c.poisoned]
            for connection in broken:
                connection.close(rst=True)
            await asyncio.gather(*(c.finish() for c in broken))

    async def _close_all(self, *, rst: bool) -> None:
        connections = list(self._connections)
        for connection in connections:
            connection.close(rst=rst)
        await asyncio.gather(*(c.finish() for c in connections))

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that started the proxy
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        handlers: set[asyncio.Task[None]] = set()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connection = _Connection(self, reader, writer)
            self.accepted += 1
            self._connections.add(connection)
            task = asyncio.current_task()
            if task is not None:
                handlers.add(task)
                task.add_done_callback(handlers.discard)
            await connection.run()

        server = await asyncio.start_server(accept, "127.0.0.1", self.port, reuse_address=True)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(handlers):
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await self._close_all(rst=False)
            await server.wait_closed()
