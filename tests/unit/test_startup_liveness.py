"""The probes while the relay waits for its servers at start-up: /healthz 200, /readyz 503 (no I/O but localhost).

A relay that waits on purpose for a database or a broker that is not up yet
is alive: a liveness probe that killed it would only start the same wait
again. It is not ready until it connected. The wait may outlast the lease
many times (``--startup-timeout``, or ``run`` riding out an outage before its
first connection), and one try may itself take long (a connect timeout).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace

import pytest

from relay.app import start
from relay.health import HealthServer
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST

SETTINGS = replace(FAST, lease_seconds=2.5, publish_timeout_seconds=0.2)
#: How long the servers stay away: twice the lease.
AWAY_SECONDS = 2 * SETTINGS.lease_seconds


class SlowStore(MemoryStore):
    """While unavailable, ``open`` fails after ``seconds`` (a connect timeout) instead of at once."""

    def __init__(self, seconds: float) -> None:
        super().__init__(lease_seconds=SETTINGS.lease_seconds)
        self.seconds = seconds

    async def open(self) -> None:
        if not self.available:
            await asyncio.sleep(self.seconds)
        await super().open()


class SlowSink(MemorySink):
    """While unavailable, ``start`` fails after ``seconds`` instead of at once."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    async def start(self) -> None:
        if not self.available:
            await asyncio.sleep(self.seconds)
        await super().start()


async def status(server: HealthServer, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(f"GET {path} HTTP/1.1\r\n\r\n".encode())
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return int(answer.split()[1])


async def probe(server: HealthServer, seconds: float) -> list[tuple[float, int, int]]:
    """(time, /healthz, /readyz) every 0.2 s for ``seconds``."""
    began, answers = time.monotonic(), []
    while (now := time.monotonic()) - began < seconds:
        answers.append((round(now - began, 1), await status(server, "/healthz"), await status(server, "/readyz")))
        await asyncio.sleep(0.2)
    return answers


def parts(down: str, slow: bool) -> tuple[SlowStore, SlowSink, SlowStore | SlowSink]:
    # A slow try takes longer than the lease on its own.
    seconds = 1.3 * SETTINGS.lease_seconds if slow else 0.0
    store, sink = SlowStore(seconds), SlowSink(seconds)
    away: SlowStore | SlowSink = store if down == "store" else sink
    away.available = False
    return store, sink, away


async def through_startup(
    down: str, slow: bool, connect: Callable[[Relay, asyncio.Event], Coroutine[object, object, object]]
) -> list[tuple[float, int, int]]:
    store, sink, away = parts(down, slow)
    store.insert("t", {"n": 1})
    relay = Relay(store, sink, SETTINGS)
    server = HealthServer(relay, "127.0.0.1", 0)
    await server.start()
    stop = asyncio.Event()
    task = asyncio.create_task(connect(relay, stop))
    try:
        answers = await probe(server, AWAY_SECONDS)
        away.available = True
        async with asyncio.timeout(3 * SETTINGS.lease_seconds):
            while not sink.delivered:
                await asyncio.sleep(0.05)
        server.started = True
        assert await status(server, "/readyz") == 200
    finally:
        stop.set()
        await task
        await server.close()
    return answers


async def serve_like(relay: Relay, stop: asyncio.Event) -> None:
    # As relay.app does: try for a while (past several leases), then run.
    assert await start(relay, 10 * SETTINGS.lease_seconds, stop)
    await relay.run(stop)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("down", "slow"), [("store", False), ("store", True), ("sink", False)])
def test_healthz_is_200_and_readyz_503_through_the_startup_timeout_wait(down: str, slow: bool) -> None:
    answers = asyncio.run(through_startup(down, slow, serve_like))
    assert len(answers) >= 10
    assert [a for a in answers if a[1] != 200] == [], "/healthz said dead while waiting for the servers"
    assert [a for a in answers if a[2] != 503] == [], "/readyz said ready before the relay connected"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("down", "slow"), [("store", False), ("sink", True)])
def test_healthz_is_200_while_run_waits_for_servers_it_never_reached(down: str, slow: bool) -> None:
    answers = asyncio.run(through_startup(down, slow, lambda relay, stop: relay.run(stop)))
    assert len(answers) >= 10
    assert [a for a in answers if a[1] != 200] == [], "/healthz said dead while waiting for the servers"
    assert [a for a in answers if a[2] != 503] == []
