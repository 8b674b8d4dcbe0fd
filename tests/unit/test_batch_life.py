"""A batch's life in one room (relay/batch): its states, its turn, and what each answer costs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from relay.backoff import Backoff
from relay.batch import Batch, Costs, Deliveries, State
from relay.batch import costs as costs_module
from relay.batch.life import hand_to_sink
from relay.batching import BatchLimits
from relay.errors import SinkTimeout, SinkUnavailable
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.metrics import Metrics
from relay.sinks.memory import MemorySink
from relay.sources.table import TableSource
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST


class WatchingSink(MemorySink):
    """A memory sink that notes the state of the batch in hand while it publishes."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: Batch | None = None
        self.seen: list[State] = []
        self.timeout = False

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        if self.watched is not None:
            self.seen.append(self.watched.state)
        if self.timeout:
            if holds is not None:
                holds.hold(events)
            raise SinkTimeout("no acknowledgement in time")
        return await super().publish(events, holds)


def room(
    store: MemoryStore, sink: MemorySink | None = None, *, grace: float = 0.0
) -> tuple[Deliveries, Costs, MemorySink]:
    sink = sink or MemorySink()
    metrics = Metrics()
    costs = Costs(FAST, metrics, BatchLimits(FAST.batch_size, FAST.batch_bytes), publish_grace_seconds=grace)
    source = TableSource(store, max_attempts=FAST.max_attempts)
    return Deliveries(source, sink, FAST, metrics, costs, publish_grace_seconds=grace), costs, sink


def filled(*keys: str) -> MemoryStore:
    store = MemoryStore()
    for i, key in enumerate(keys):
        store.insert("t", {"i": i}, key=key)
    return store


def test_an_acknowledged_batch_goes_claimed_handed_judged_settled() -> None:
    store = filled("a", "b")
    sink = WatchingSink()
    deliveries, _, _ = room(store, sink)

    async def scenario() -> Batch:
        claim = await store.claim(10, max_attempts=FAST.max_attempts)
        batch = deliveries.take(claim, time.monotonic())
        assert batch.state is State.CLAIMED and not batch.turn.is_set()
        sink.watched = batch
        await deliveries.deliver(batch)
        return batch

    batch = asyncio.run(scenario())
    assert sink.seen == [State.HANDED]
    assert batch.state is State.SETTLED and batch.turn.is_set()
    assert not store.rows, "the settle recorded both events as sent"
    assert not deliveries.flying


def test_a_batch_waits_for_the_turn_of_the_batch_taken_before_it() -> None:
    store = filled("k", "k", "k", "k")
    deliveries, _, sink = room(store)

    async def scenario() -> list[int]:
        first = deliveries.take(await store.claim(2, max_attempts=3), time.monotonic())
        second = deliveries.take(
            await store.claim(2, max_attempts=3, chain=deliveries.chain(time.monotonic())), time.monotonic()
        )
        assert second.before is first.turn and all(e.chained for e in second.claim.events)
        task = asyncio.create_task(deliveries.deliver(second))
        await asyncio.sleep(0.05)
        assert second.state is State.CLAIMED and not sink.attempted, "it went before the batch it goes on from"
        await deliveries.deliver(first)
        await task
        return [e.id for e in sink.delivered]

    assert asyncio.run(scenario()) == [1, 2, 3, 4]


def test_a_stale_batch_that_holds_nothing_any_more_is_given_back_and_holds_its_keys() -> None:
    store = filled("a", "b")
    deliveries, _, sink = room(store)
    deliveries.latest_publish_start = 0.0

    async def scenario() -> Batch:
        claim = await store.claim(10, max_attempts=3)
        for row in store.rows.values():
            row.claim_token = None  # another relay took them over
        batch = deliveries.take(claim, time.monotonic() - 1.0)
        await deliveries.deliver(batch)
        return batch

    batch = asyncio.run(scenario())
    assert batch.state is State.GIVEN_BACK and batch.turn.is_set()
    assert not sink.attempted
    assert deliveries.holds.held("a") and deliveries.holds.held("b")


def test_a_stale_batch_renews_its_lease_and_is_published() -> None:
    store = filled("a", "b")
    deliveries, _, sink = room(store)
    deliveries.latest_publish_start = 0.5

    taken_at = time.monotonic() - 1.0

    async def scenario() -> Batch:
        batch = deliveries.take(await store.claim(10, max_attempts=3), taken_at)
        await deliveries.deliver(batch)
        return batch

    batch = asyncio.run(scenario())
    assert batch.state is State.SETTLED
    assert batch.claimed_at >= taken_at + 1.0, "its lease starts again from the renewal"
    assert [e.id for e in sink.delivered] == [1, 2] and not store.rows


def test_a_batch_ended_before_the_sink_holds_its_keys_once() -> None:
    store = filled("a", "b")
    deliveries, _, _ = room(store)
    claim = asyncio.run(store.claim(10, max_attempts=3))
    batch = deliveries.take(claim, time.monotonic())
    deliveries.end(batch)
    deliveries.end(batch)  # the task's finally and its done callback both end it
    assert batch.turn.is_set() and deliveries.holds.held("a") and deliveries.holds.held("b")
    assert list(deliveries.recent_keys) == [frozenset({"a", "b"})]


def test_a_publish_that_times_out_gives_the_batch_back_and_shrinks_the_next_ones() -> None:
    store = filled("a", "b")
    sink = WatchingSink()
    sink.timeout = True
    deliveries, costs, _ = room(store, sink)

    async def scenario() -> Batch:
        batch = deliveries.take(await store.claim(10, max_attempts=3), time.monotonic())
        await deliveries.deliver(batch)
        return batch

    batch = asyncio.run(scenario())
    assert batch.state is State.SETTLED
    assert all(row.claim_token is None and row.attempts == 0 for row in store.rows.values()), "given back, no attempt"
    assert costs.timeouts.failures == 1 and costs.limits.shrunk_by_timeouts
    assert costs.resume_claims_at > time.monotonic()
    assert costs.metrics.failed_attempts._value.get() == 2


def test_a_broker_gone_gives_the_batch_back_at_once_and_stops_the_claims() -> None:
    store = filled("a", "b")
    deliveries, costs, sink = room(store)
    sink.available = False

    async def scenario() -> None:
        await deliveries.deliver(deliveries.take(await store.claim(10, max_attempts=3), time.monotonic()))

    asyncio.run(scenario())
    assert costs.sink_down and not costs.timeouts.failures
    assert all(row.claim_token is None and row.attempts == 0 for row in store.rows.values())
    assert deliveries.holds.held("a")
    costs.broker_recovered()
    assert not costs.sink_down


def test_a_failed_event_is_retried_and_the_gauges_are_told() -> None:
    store = filled("a", "b")
    deliveries, costs, _ = room(store, MemorySink(lambda e: Failure("no") if e.key == "a" else None))

    async def scenario() -> None:
        await deliveries.deliver(deliveries.take(await store.claim(10, max_attempts=3), time.monotonic()))

    asyncio.run(scenario())
    assert costs.retried
    assert [(row.key, row.attempts, row.last_error) for row in store.rows.values()] == [("a", 1, "no")]


class ForgetfulSink(MemorySink):
    """Answers without holding a single key: a sink that forgot the holds' part of the contract."""

    def __init__(self, answer: list[Outcome] | SinkTimeout | SinkUnavailable) -> None:
        super().__init__()
        self.answer = answer

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    "answer",
    [[None, Failure("no")], SinkTimeout("no acknowledgement in time"), SinkUnavailable("gone")],
    ids=["a failure", "timed out", "broker gone"],
)
def test_the_room_holds_every_key_a_forgetful_sink_did_not_get_acknowledged(
    answer: list[Outcome] | SinkTimeout | SinkUnavailable,
) -> None:
    events = list(asyncio.run(filled("a", "b").claim(10, max_attempts=3)).events)
    holds = KeyHolds()
    published = asyncio.run(hand_to_sink(ForgetfulSink(answer), events, holds, traced=False))
    assert published is answer
    assert holds.held("b") and holds.held("a") == (not isinstance(answer, list))


def test_events_taken_over_before_the_settle_count_as_lost_leases() -> None:
    store = filled("a", "b", "c")
    deliveries, costs, sink = room(store)

    async def scenario() -> Batch:
        batch = deliveries.take(await store.claim(10, max_attempts=3), time.monotonic())
        for row in list(store.rows.values())[:2]:
            row.claim_token = uuid4()  # another relay took these over meanwhile
        await deliveries.deliver(batch)
        return batch

    batch = asyncio.run(scenario())
    assert batch.state is State.SETTLED and len(sink.delivered) == 3
    assert costs.metrics.lost_leases._value.get() == 2
    assert len(store.rows) == 2, "only the event still leased here is deleted"


def test_each_acknowledged_event_counts_its_own_latency_whether_or_not_it_shares_its_creation_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = datetime.now(UTC)
    ages = [10.0, 10.0, 5.0, 10.0, 0.0, 7.0]  # a run sharing one time, others between, one failed at 0
    created = {age: now - timedelta(seconds=age) for age in set(ages)}
    events = [Event(i, "t", "k", b"{}", {}, f"i{i}", 1, created[age]) for i, age in enumerate(ages)]
    # Equal times as distinct objects too (the table's rows): equal, not identical, is what counts.
    events[3].created_at = now - timedelta(seconds=10.0)
    outcomes: list[Outcome] = [None, None, None, None, Failure("no"), None]
    seen: list[float] = []
    monkeypatch.setattr(costs_module, "observe_many", lambda _histogram, values: seen.extend(values))
    verdict = costs_module.judge(events, outcomes, FAST, Backoff(0.1, 1.0), Metrics())
    assert verdict.sent == [0, 1, 2, 3, 5]
    assert seen == pytest.approx([10.0, 10.0, 5.0, 10.0, 7.0], abs=1.0)
