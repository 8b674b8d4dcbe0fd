"""The probe server cannot be worn out: bounded connections, slow clients timed out, not ready once stopping.

Clients here are real sockets on localhost against the real server; the relay
behind it is the in-memory one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import replace

import pytest

from relay import app, health
from relay.app import RunConfig
from relay.config import TableName, parse_sink_url
from relay.events import Event, Outcome
from relay.health import HealthServer
from relay.holds import KeyHolds
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.memory import MemoryStore
from tests.unit.test_health import HangingStore, get, started
from tests.unit.test_loop import FAST

#: Most sockets the server may hold for idle clients: the cap, and a few closing meanwhile.
HELD_AT_MOST = 64 + 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def status(server: HealthServer, path: str, *, timeout: float = 2.0) -> int:
    async with asyncio.timeout(timeout):
        answer = await get(server, f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
    return int(answer.split()[1])


class Clients:
    """Client connections that send ``first``, then one byte of ``trickle`` every 0.2 s; all closed at the end."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.tricklers: list[asyncio.Task[None]] = []

    async def hold(self, port: int, first: bytes, trickle: bytes = b"") -> asyncio.StreamReader:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        self.writers.append(writer)
        writer.write(first)
        await writer.drain()
        if trickle:
            self.tricklers.append(asyncio.create_task(self._trickle(writer, trickle)))
        return reader

    @staticmethod
    async def _trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
        # A client that is never quite done with its request.
        with contextlib.suppress(ConnectionError):
            while True:
                await asyncio.sleep(0.2)
                writer.write(data)
                await writer.drain()

    async def close(self) -> None:
        for task in self.tricklers:
            task.cancel()
        await asyncio.gather(*self.tricklers, return_exceptions=True)
        for writer in self.writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in self.writers), return_exceptions=True)


async def ending(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """All the server sent until it closed; ``(reset)`` if the client's own write found the socket closed
    first (a trickling client: asyncio then raises that error in place of what was read)."""
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    except ConnectionError:
        return b"(reset)"


#: Clients that never send a whole request, each in its own way.
IDLE = {
    "silent": (b"", b""),
    "half a request line": (b"GET /heal", b""),
    "no blank line": (b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b""),
    "trickling headers": (b"GET /healthz HTTP/1.1\r\nX-Slow: ", b"a"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", list(IDLE))
def test_many_idle_clients_hold_a_bounded_number_of_sockets_and_the_probe_still_answers(kind: str) -> None:
    first, trickle = IDLE[kind]

    async def scenario() -> None:
        server, clients = await started(MemoryStore()), Clients()
        try:
            before = open_fds()
            readers = [await clients.hold(server.port, first, trickle) for _ in range(300)]
            await asyncio.sleep(0.3)
            # 300 client sockets are ours; the rest is what the server holds for them.
            held = open_fds() - before - len(readers)
            assert held <= HELD_AT_MOST, f"the server holds {held} sockets for idle clients"
            began = time.monotonic()
            assert await status(server, "/healthz") == 200
            assert await status(server, "/readyz") == 200
            assert time.monotonic() - began < 1.0
            # Those it let go were told why, and closed.
            answers = await asyncio.gather(*(ending(r, 2.0) for r in readers[:200]))
            assert all(a.startswith((b"HTTP/1.1 408 ", b"(reset)")) for a in answers), {a[:40] for a in answers}
        finally:
            await clients.close()
            await server.close()

    asyncio.run(scenario())


@pytest.mark.timeout(30)
def test_a_client_that_never_sends_a_whole_request_is_answered_408_and_closed_within_5_s() -> None:
    async def scenario() -> list[tuple[str, float, bytes]]:
        server, clients = await started(MemoryStore()), Clients()
        try:
            began = time.monotonic()
            readers = {kind: await clients.hold(server.port, *IDLE[kind]) for kind in IDLE}

            async def timed(kind: str, reader: asyncio.StreamReader) -> tuple[str, float, bytes]:
                answer = await ending(reader, 10.0)
                return kind, time.monotonic() - began, answer

            return await asyncio.gather(*(timed(kind, reader) for kind, reader in readers.items()))
        finally:
            await clients.close()
            await server.close()

    for kind, seconds, answer in asyncio.run(scenario()):
        assert answer.startswith((b"HTTP/1.1 408 ", b"(reset)")), (kind, answer[:60])
        assert 4.5 <= seconds <= 6.0, (kind, seconds)


@pytest.mark.timeout(30)
def test_at_the_cap_with_every_connection_being_answered_healthz_is_answered_and_the_rest_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health, "READY_CHECK_TIMEOUT_SECONDS", 1.0)
    store = HangingStore()

    async def scenario() -> None:
        server = await started(store)
        try:
            # 64 readiness probes, each waiting up to a second for a database that hangs.
            slow = [asyncio.create_task(status(server, "/readyz", timeout=5)) for _ in range(64)]
            await asyncio.sleep(0.3)
            # A liveness probe is answered from memory, cap or not: a busy relay is not a dead one.
            for request in (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /healthz?x=1 HTTP/1.0\r\n\r\n"):
                began = time.monotonic()
                answer = await get(server, request)
                assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"ok\n"), answer
                assert time.monotonic() - began < 0.5
            head = await get(server, b"HEAD /healthz HTTP/1.1\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n"), head
            # Anything else is refused at once, with the whole request read (so no reset).
            for request in (
                b"GET /metrics HTTP/1.1\r\n\r\n",
                b"GET /readyz HTTP/1.1\r\n\r\n",
                b"POST /healthz HTTP/1.1\r\n\r\n",
                b"GET /healthzz HTTP/1.1\r\n\r\n",
                b"nonsense\r\n\r\n",
            ):
                began = time.monotonic()
                answer = await get(server, request)
                assert answer.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in answer, (request, answer)
                assert time.monotonic() - began < 0.5
            # A client that sends nothing is refused after OVER_CAP_REQUEST_SECONDS, not held for longer.
            began = time.monotonic()
            answer = await get(server, b"")
            assert answer.startswith(b"HTTP/1.1 503 "), answer
            assert time.monotonic() - began < health.OVER_CAP_REQUEST_SECONDS + 0.5
            assert set(await asyncio.gather(*slow)) == {503}
            assert await status(server, "/healthz") == 200
        finally:
            store.answer.set()
            await server.close()

    asyncio.run(scenario())


def test_readyz_is_503_once_stopping_and_healthz_stays_200() -> None:
    async def scenario() -> list[tuple[int, int]]:
        stop = asyncio.Event()
        server = HealthServer(Relay(MemoryStore(), MemorySink(), FAST), "127.0.0.1", 0, stopping=stop)
        await server.start()
        server.started = True
        try:
            answers = [(await status(server, "/healthz"), await status(server, "/readyz"))]
            stop.set()
            answers.append((await status(server, "/healthz"), await status(server, "/readyz")))
            return answers
        finally:
            await server.close()

    assert asyncio.run(scenario()) == [(200, 200), (200, 503)]


class GatedSink(MemorySink):
    """Holds every publish until ``gate`` is set; ``waiting`` once one is held."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        self.waiting.set()
        await self.gate.wait()
        return await super().publish(events, holds)


@pytest.mark.timeout(60)
def test_after_sigterm_readyz_answers_503_while_the_batch_in_hand_drains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``app.serve``, as ``outbox-relay run`` does: the signal, then the drain."""
    settings = replace(FAST, lease_seconds=10.0, publish_timeout_seconds=1.0)
    store, sink = MemoryStore(lease_seconds=settings.lease_seconds), GatedSink()
    store.insert("t", {})
    relay = Relay(store, sink, settings)
    monkeypatch.setattr(app, "build_relay", lambda config: relay)
    port = free_port()
    config = RunConfig(
        "postgresql://db/x",
        TableName.parse("outbox"),
        parse_sink_url("kafka://k:1"),
        settings,
        metrics_port=port,
    )

    async def scenario() -> list[tuple[int, int]]:
        serving = asyncio.create_task(app.serve(config))
        await sink.waiting.wait()  # a batch in hand
        probe = HealthServer(relay, "127.0.0.1", port)  # only to reach the relay's port
        answers = [(await status(probe, "/healthz"), await status(probe, "/readyz"))]
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.3)
        assert not serving.done(), "stopped without draining the batch in hand"
        answers.append((await status(probe, "/healthz"), await status(probe, "/readyz")))
        sink.gate.set()
        await serving
        return answers

    assert asyncio.run(scenario()) == [(200, 200), (200, 503)]


@pytest.mark.timeout(30)
def test_a_client_that_never_reads_its_answer_does_not_hold_the_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "ANSWER_TIMEOUT_SECONDS", 1.0, raising=False)

    async def scenario() -> int:
        server = await started(MemoryStore())
        # An answer far larger than the socket buffers: it can only leave as the client reads.
        monkeypatch.setattr(server.relay.metrics, "render", lambda: b"#" * 50_000_000)
        clients = Clients()
        try:
            before = open_fds()
            await clients.hold(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
            await asyncio.sleep(3.0)  # the answer's time, then the close's, and a margin
            held = open_fds() - before - 1  # the client's socket is ours
            assert await status(server, "/healthz") == 200
            return held
        finally:
            await clients.close()
            await server.close()

    assert asyncio.run(scenario()) == 0, "the server still holds the socket of a client that does not read"
