"""The probe server: /readyz answers in time whatever the checks do, and every request gets an answer."""

from __future__ import annotations

import asyncio
import time

import pytest

from relay import health
from relay.health import HealthServer
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST


class HangingStore(MemoryStore):
    """A database that stops answering: ``check()`` waits until ``answer`` is set, and counts."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.checks = 0
        self.cancelled = 0

    async def check(self) -> None:
        self.checks += 1
        try:
            await self.answer.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def started(store: MemoryStore) -> HealthServer:
    server = HealthServer(Relay(store, MemorySink(), FAST), "127.0.0.1", 0)
    await server.start()
    server.started = True
    return server


async def get(server: HealthServer, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def test_readyz_answers_503_in_time_while_the_database_hangs_and_never_cancels_its_check(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(health, "READY_CHECK_TIMEOUT_SECONDS", 0.3)
    store = HangingStore()

    async def scenario() -> None:
        server = await started(store)
        try:
            began = time.monotonic()
            answers = await asyncio.gather(*(get(server, b"GET /readyz HTTP/1.1\r\n\r\n") for _ in range(3)))
            assert time.monotonic() - began < 2.0
            assert all(a.startswith(b"HTTP/1.1 503 ") for a in answers), answers
            # Probes share one check, which goes on: the hung statement is left to finish, not cancelled.
            assert (store.checks, store.cancelled) == (1, 0)
            store.answer.set()
            answer = await get(server, b"GET /readyz HTTP/1.1\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 200 "), answer
        finally:
            await server.close()

    with caplog.at_level("INFO", logger="relay.health"):
        asyncio.run(scenario())
    assert "not ready: the database did not answer within 0.3 s" in caplog.text


@pytest.mark.parametrize(
    ("request_bytes", "status", "has_body"),
    [
        (b"GET /healthz HTTP/1.1\r\n\r\n", b"200", True),
        (b"HEAD /healthz HTTP/1.1\r\n\r\n", b"200", False),
        (b"HEAD /metrics HTTP/1.0\r\nHost: x\r\n\r\n", b"200", False),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", b"404", True),
        (b"POST /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405", True),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", b"405", True),
        (b"hello\r\n\r\n", b"400", True),
        (b"GET /healthz\r\n\r\n", b"400", True),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", b"431", True),
        (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"b" * 70_000 + b"\r\n\r\n", b"431", True),
    ],
)
def test_every_request_gets_an_answer(
    request_bytes: bytes, status: bytes, has_body: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> bytes:
        server = await started(MemoryStore())
        try:
            answer = await get(server, request_bytes)
            # And the server goes on answering.
            assert (await get(server, b"GET /healthz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
            return answer
        finally:
            await server.close()

    answer = asyncio.run(scenario())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status + b" "), head[:80]
    assert bool(body) == has_body
    if status == b"405":
        assert b"\r\nAllow: GET, HEAD" in head
    assert "Traceback" not in caplog.text and "Unhandled exception" not in caplog.text
