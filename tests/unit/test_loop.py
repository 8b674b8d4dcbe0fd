"""The relay loop on the in-memory store and sink (no I/O)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relay.config import RelaySettings
from relay.errors import StoreError
from relay.events import Event, Failure, Outcome
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim, Dead, Retry, Settlement, Status
from relay.store.memory import MemoryStore

FAST = RelaySettings(
    batch_size=10,
    max_attempts=3,
    backoff_initial_seconds=0.01,
    backoff_max_seconds=0.02,
    lease_seconds=5,
    publish_timeout_seconds=1,
    poll_interval_seconds=0.01,
    poll_interval_max_seconds=0.02,
)


async def run_until(relay: Relay, done: Callable[[], bool], timeout: float = 5.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.005)
                if task.done():
                    task.result()
    finally:
        stop.set()
        await task


def go(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def test_delivers_everything_and_deletes_it() -> None:
    store, sink = MemoryStore(), MemorySink()
    for i in range(35):
        store.insert("t", {"i": i}, key=f"k{i % 4}" if i % 3 else None)
    relay = Relay(store, sink, FAST)
    go(run_until(relay, lambda: not store.rows))
    assert sorted(e.id for e in sink.delivered) == list(range(1, 36))
    assert relay.metrics.published.labels("t")._value.get() == 35


def test_each_key_is_delivered_in_write_order() -> None:
    store, sink = MemoryStore(), MemorySink()
    for i in range(60):
        store.insert("t", {"i": i}, key=f"k{i % 5}", priority=i % 3)
    go(run_until(Relay(store, sink, FAST), lambda: not store.rows))
    for k in range(5):
        ids = [e.id for e in sink.delivered if e.key == f"k{k}"]
        assert ids == sorted(ids) and len(ids) == 12


def test_a_transient_failure_is_retried_and_not_overtaken_by_its_key() -> None:
    failures = {"first": 2}

    def flaky(event: Event) -> Outcome:
        if failures.get(event.idempotency_key, 0) > 0:
            failures[event.idempotency_key] -= 1
            return Failure("broker hiccup")
        return None

    store, sink = MemoryStore(), MemorySink(flaky)
    store.insert("t", {}, key="k", idempotency_key="first")
    store.insert("t", {}, key="k", idempotency_key="second")
    go(run_until(Relay(store, sink, FAST), lambda: not store.rows))
    assert [e.idempotency_key for e in sink.attempted] == ["first", "first", "first", "second"]
    assert [e.idempotency_key for e in sink.delivered] == ["first", "second"]


def test_each_retry_of_an_event_waits_longer_than_the_last() -> None:
    class RecordingStore(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.delays: list[float] = []

        async def settle(
            self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
        ) -> Settlement:
            self.delays.extend(r.delay_seconds for r in retry)
            return await super().settle(claim, sent=sent, retry=retry, dead=dead)

    store, sink = RecordingStore(), MemorySink(lambda e: Failure("broker hiccup"))
    store.insert("t", {}, idempotency_key="flaky")
    settings = replace(FAST, max_attempts=6, backoff_max_seconds=60)
    go(run_until(Relay(store, sink, settings), lambda: next(iter(store.rows.values())).state == "failed"))
    delays = store.delays
    assert len(delays) == 5
    # Jitter adds up to one initial delay, so neighbours may meet, but the
    # exponential part doubles: no delay is shorter than the one before, and
    # two retries later it has at least doubled.
    assert delays == sorted(delays), delays
    assert all(later >= 2 * earlier for earlier, later in zip(delays, delays[2:], strict=False)), delays


def test_an_event_that_keeps_failing_is_dead_lettered_and_parks_only_its_key() -> None:
    store, sink = (
        MemoryStore(),
        MemorySink(lambda e: Failure("nope") if e.idempotency_key == "poison" else None),
    )
    store.insert("t", {}, key="k", idempotency_key="poison")
    store.insert("t", {}, key="k", idempotency_key="blocked")
    for i in range(5):
        store.insert("t", {}, key=f"other{i}")
    relay = Relay(store, sink, FAST)
    go(
        run_until(
            relay,
            lambda: {r.state for r in store.rows.values()} == {"failed", "pending"} and len(store.rows) == 2,
        )
    )
    poison = next(r for r in store.rows.values() if r.idempotency_key == "poison")
    assert poison.state == "failed" and poison.attempts == 3 and "after 3 attempts" in (poison.last_error or "")
    assert [e.idempotency_key for e in sink.attempted].count("poison") == 3
    assert "blocked" not in [e.idempotency_key for e in sink.attempted]
    assert relay.metrics.dead_lettered._value.get() == 1


def test_a_permanent_failure_is_dead_lettered_at_once() -> None:
    store = MemoryStore()
    sink = MemorySink(lambda e: Failure("message too large", permanent=True))
    store.insert("t", {}, idempotency_key="big")
    go(run_until(Relay(store, sink, FAST), lambda: next(iter(store.rows.values())).state == "failed"))
    row = next(iter(store.rows.values()))
    assert row.attempts == 1 and row.last_error == "message too large"


def test_broker_outage_releases_batches_without_burning_attempts() -> None:
    store, sink = MemoryStore(), MemorySink()
    sink.available = False
    for i in range(5):
        store.insert("t", {"i": i})

    async def scenario() -> None:
        relay = Relay(store, sink, FAST)
        stop = asyncio.Event()
        await store.open()
        relay_task = asyncio.create_task(relay.run(stop))
        await asyncio.sleep(0.3)
        assert not sink.delivered
        assert all(r.attempts == 0 and r.state == "pending" for r in store.rows.values())
        sink.available = True
        async with asyncio.timeout(5):
            while store.rows:
                await asyncio.sleep(0.01)
        stop.set()
        await relay_task

    go(scenario())
    assert len(sink.delivered) == 5


def test_database_outage_is_ridden_out() -> None:
    store, sink = MemoryStore(), MemorySink()

    async def scenario() -> None:
        relay = Relay(store, sink, FAST)
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        await asyncio.sleep(0.05)
        store.available = False
        store.insert("t", {})
        await asyncio.sleep(0.3)
        assert not task.done()
        store.available = True
        async with asyncio.timeout(5):
            while store.rows:
                await asyncio.sleep(0.01)
        stop.set()
        await task

    go(scenario())
    assert len(sink.delivered) == 1


def test_stop_finishes_the_batch_in_hand() -> None:
    store = MemoryStore()
    gate = asyncio.Event()

    class SlowSink(MemorySink):
        async def publish(self, events: Any, holds: Any = None) -> list[Outcome]:
            await gate.wait()
            return await super().publish(events, holds)

    sink = SlowSink()
    store.insert("t", {})

    async def scenario() -> None:
        relay = Relay(store, sink, FAST)
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        while not any(r.claim_token for r in store.rows.values()):
            await asyncio.sleep(0.005)
        stop.set()
        await asyncio.sleep(0.05)
        assert not task.done()
        gate.set()
        await asyncio.wait_for(task, 2)

    go(scenario())
    assert len(sink.delivered) == 1 and not store.rows and sink.closed


def test_a_bug_in_a_sink_stops_the_relay_loudly() -> None:
    class BrokenSink(MemorySink):
        async def publish(self, events: Any, holds: Any = None) -> list[Outcome]:
            return []

    store = MemoryStore()
    store.insert("t", {})

    async def scenario() -> None:
        await Relay(store, BrokenSink(), FAST).run(asyncio.Event())

    with pytest.raises(RuntimeError, match="outcomes"):
        asyncio.run(asyncio.wait_for(scenario(), 5))


def test_a_batch_that_crashes_holds_its_keys_for_the_batches_drained_after_it() -> None:
    """The relay stops loudly; the crashed batch's events stay leased, so the batches in hand it
    drains on the way out must send nothing later of their keys (they would overtake them)."""

    class BrokenOnce(MemorySink):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        async def publish(self, events: Any, holds: Any = None) -> list[Outcome]:
            self.calls += 1
            if self.calls == 1:
                return []  # a bug: too few outcomes, and the judge raises
            return await super().publish(events, holds)

    store, sink = MemoryStore(), BrokenOnce()
    for i in range(6):
        store.insert("t", {"i": i}, key="k")
    relay = Relay(store, sink, replace(FAST, batch_size=2, pipeline_depth=3))

    with pytest.raises(RuntimeError, match="outcomes"):
        asyncio.run(asyncio.wait_for(relay.run(asyncio.Event()), 5))

    assert sink.calls > 1, "no batch was in hand behind the one that crashed"
    assert not sink.delivered, [e.id for e in sink.delivered]
    assert relay.holds.held("k")


class _GaugesFailTwice(MemoryStore):
    """A store whose gauges fail twice as no outage does (a row no query expected), then answer."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    async def gauges(self) -> Status:
        if self.failures < 2:
            self.failures += 1
            raise StoreError("cannot subtract infinite timestamps")
        return await super().gauges()

    async def oldest_pending_age(self) -> float:
        if self.failures < 2:
            self.failures += 1
            raise TypeError("float() argument must be a string or a real number, not 'NoneType'")
        return await super().oldest_pending_age()


def test_the_gauges_go_on_after_a_failure_no_outage_explains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped for good, they would read 0 while a backlog waits: the alerts on them would never fire."""
    monkeypatch.setattr("relay.progress.AGE_INTERVAL_SECONDS", 0.01)
    monkeypatch.setattr("relay.progress.COUNTS_INTERVAL_SECONDS", 0.01)
    store = _GaugesFailTwice()
    later = datetime.now(UTC) + timedelta(hours=1)
    for i in range(3):
        store.insert("t", {"i": i}, deliver_at=later)  # pending, and never due while the test runs
    relay_ = Relay(store, MemorySink(), FAST)
    go(run_until(relay_, lambda: relay_.metrics.scheduled._value.get() == 3))
    assert store.failures == 2
