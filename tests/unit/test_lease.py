"""What the lease covers: connecting once, and settling only while the lease (counted from the claim) lasts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from relay.app import start
from relay.events import Event, Outcome
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim, Dead, Retry, Settlement
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, run_until


class CountingStore(MemoryStore):
    """Counts connections and times claims and settles."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.opens = 0
        self.claimed_at: list[float] = []
        self.settles: list[float] = []

    async def open(self) -> None:
        self.opens += 1
        await super().open()

    async def claim(self, limit: int, *, max_attempts: int, max_bytes: int | None = None) -> Claim:
        claim = await super().claim(limit, max_attempts=max_attempts, max_bytes=max_bytes)
        if claim.events:
            self.claimed_at.append(time.monotonic())
        return claim

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        self.settles.append(time.monotonic())
        return await super().settle(claim, sent=sent, retry=retry, dead=dead)


class CountingSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        await super().start()


def test_start_then_run_connects_the_store_and_the_sink_once() -> None:
    store, sink = CountingStore(), CountingSink()
    for i in range(5):
        store.insert("t", {"i": i})
    relay = Relay(store, sink, FAST)

    async def scenario() -> None:
        assert await start(relay, timeout=1.0)
        await run_until(relay, lambda: not store.rows)

    asyncio.run(scenario())
    assert (store.opens, sink.starts) == (1, 1)
    assert len(sink.delivered) == 5


def test_run_alone_connects_too() -> None:
    store, sink = CountingStore(), CountingSink()
    store.insert("t", {})
    asyncio.run(run_until(Relay(store, sink, FAST), lambda: not store.rows))
    assert (store.opens, sink.starts) == (1, 1)


def test_a_settle_is_retried_only_until_the_lease_that_began_at_the_claim_ends() -> None:
    """The publish takes a third of the lease; then the database goes away for good.

    Settles are retried until the lease ends, counted from the claim: not a
    whole lease from the first settle, by when another relay may have sent
    the events again.
    """
    settings = replace(FAST, lease_seconds=3.0, publish_timeout_seconds=0.5)
    store = CountingStore(lease_seconds=settings.lease_seconds)

    class SlowSink(MemorySink):
        async def publish(self, events: Sequence[Event]) -> list[Outcome]:
            await asyncio.sleep(1.0)
            outcomes = await super().publish(events)
            store.available = False
            return outcomes

    store.insert("t", {})
    relay = Relay(store, SlowSink(), settings)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        await asyncio.sleep(settings.lease_seconds + 1.5)
        stop.set()
        await task

    asyncio.run(scenario())
    [claimed_at] = store.claimed_at
    tries = [round(at - claimed_at, 2) for at in store.settles]
    assert len(tries) >= 3, tries
    assert tries[0] >= 1.0, tries
    # The last try comes as the lease ends, give or take the loop's own latency.
    assert settings.lease_seconds - 0.5 <= tries[-1] <= settings.lease_seconds + 0.25, tries
