"""/healthz's answer: alive while the loop waits on purpose, stale only when it is wedged (no I/O)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

import pytest

from relay import loop
from relay.errors import StoreUnavailable
from relay.events import Event, Outcome
from relay.health import HealthServer
from relay.holds import KeyHolds
from relay.loop import BEAT_SECONDS, Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim, Dead, Retry, Settlement
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, run_until

SETTINGS = replace(FAST, batch_size=5, lease_seconds=3.0, publish_timeout_seconds=0.5)


class GatedSink(MemorySink):
    """Holds every publish until ``gate`` is set (forever, if it never is)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        self.waiting += 1
        await self.gate.wait()
        return await super().publish(events, holds)


class SlowToFailStore(MemoryStore):
    """While unavailable, a settle takes a second to fail (a connect timeout), as over a real network."""

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        if not self.available:
            await asyncio.sleep(1.0)
            raise StoreUnavailable("connection timeout expired")
        return await super().settle(claim, sent=sent, retry=retry, dead=dead)


async def watch(probe: HealthServer, seconds: float) -> list[float]:
    """Poll ``alive()`` for ``seconds``; the times (since the start) it said dead."""
    started, dead = time.monotonic(), []
    while (now := time.monotonic()) - started < seconds:
        if not probe.alive():
            dead.append(round(now - started, 2))
        await asyncio.sleep(0.05)
    return dead


def test_a_full_pipeline_waiting_out_a_database_outage_is_alive_and_resumes() -> None:
    store, sink = SlowToFailStore(lease_seconds=SETTINGS.lease_seconds), GatedSink()
    for i in range(40):
        store.insert("t", {"i": i})
    relay = Relay(store, sink, SETTINGS)
    probe = HealthServer(relay, "127.0.0.1", 0)

    dead: list[float] = []

    async def outage() -> None:
        while sink.waiting < SETTINGS.pipeline_depth:  # the pipeline is full
            await asyncio.sleep(0.01)
        store.available = False
        sink.gate.set()  # the broker has the batches; their settles fail until the lease ends
        dead.extend(await watch(probe, 2 * SETTINGS.lease_seconds))
        store.available = True

    async def scenario() -> None:
        task = asyncio.create_task(outage())
        await run_until(relay, lambda: task.done() and not store.rows, timeout=30)
        await task

    asyncio.run(scenario())
    assert dead == [], f"/healthz said dead at {dead} s into the outage"
    assert {e.id for e in sink.delivered} == set(range(1, 41))


def test_a_loop_wedged_behind_a_batch_that_never_ends_goes_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    allowance = 2.0
    monkeypatch.setattr(loop, "CALL_ALLOWANCE_SECONDS", allowance)
    store, sink = MemoryStore(lease_seconds=SETTINGS.lease_seconds), GatedSink()
    store.insert("t", {})
    relay = Relay(store, sink, replace(SETTINGS, pipeline_depth=1))
    probe = HealthServer(relay, "127.0.0.1", 0)
    # The batch is overdue a call allowance after its lease; the beat is stale a lease after that.
    wedged_after = SETTINGS.lease_seconds + allowance + SETTINGS.lease_seconds

    async def scenario() -> list[float]:
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        dead = await watch(probe, wedged_after + 1.0)
        sink.gate.set()
        stop.set()
        await task
        return dead

    dead = asyncio.run(scenario())
    # Alive while the batch could still be in its time, dead a lease after the last beat.
    assert dead and wedged_after - BEAT_SECONDS - 0.3 <= dead[0] <= wedged_after + 0.3, dead
