"""An unchained event of an earlier batch, admitted late, must not lift a hold a later batch set.

A sink that admits events after ``publish`` first awaits (Kafka: its produce thread, behind a
backlog; RabbitMQ: a send behind an awaited confirm) lets the batch room go on meanwhile: the next
batch checks its lease and may be given back, holding its keys, and the batch after it (chained on
it) is handed over. If the earlier batch's unchained event of the key is admitted only then, it
discards the hold (``KeyHolds.admit``), and the batch chained on the given-back one sends its
events of the key past the ones given back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from relay.batch import Costs, Deliveries, State
from relay.batching import BatchLimits
from relay.errors import StoreUnavailable
from relay.events import Event, Outcome
from relay.holds import KeyHolds
from relay.metrics import Metrics
from relay.sinks.memory import MemorySink
from relay.sources.table import TableSource
from relay.store.base import Claim
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST


class BackloggedSink(MemorySink):
    """Admits each call's events in call order, once ``gate`` opens (a produce thread behind a backlog)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.order = asyncio.Lock()

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        async with self.order:
            await self.gate.wait()
            return await super().publish(events, holds)


class BlipSource(TableSource):
    """A renewal of one claim meets a database blip."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store, max_attempts=FAST.max_attempts)
        self.blip_for: object = None

    async def renew(self, batch: Claim) -> set[int]:
        if batch.token == self.blip_for:
            raise StoreUnavailable("connection lost")
        return await super().renew(batch)


def test_a_late_unchained_event_does_not_lift_the_hold_of_a_batch_given_back_after_it() -> None:
    store = MemoryStore()
    for i in range(5):
        store.insert("t", {"i": i}, key="k")
    sink = BackloggedSink()
    source = BlipSource(store)
    metrics = Metrics()
    costs = Costs(FAST, metrics, BatchLimits(FAST.batch_size, FAST.batch_bytes))
    deliveries = Deliveries(source, sink, FAST, metrics, costs)
    deliveries.latest_publish_start = 0.5

    async def scenario() -> None:
        first = deliveries.take(await store.claim(2, max_attempts=3), time.monotonic())
        second = deliveries.take(
            await store.claim(2, max_attempts=3, chain=deliveries.chain(time.monotonic())), time.monotonic()
        )
        third = deliveries.take(
            await store.claim(1, max_attempts=3, chain=deliveries.chain(time.monotonic())), time.monotonic()
        )
        assert [(e.id, e.chained) for e in first.claim.events] == [(1, False), (2, True)]
        assert [(e.id, e.chained) for e in second.claim.events] == [(3, True), (4, True)]
        assert [(e.id, e.chained) for e in third.claim.events] == [(5, True)]
        # The first two waited past the time a batch may start publishing in (a stalled process):
        # the first renews its lease, the second's renewal meets a database blip.
        first.claimed_at = second.claimed_at = time.monotonic() - 1.0
        source.blip_for = second.claim.token  # its renewal fails: it goes back, its key held
        tasks = [asyncio.create_task(deliveries.deliver(b)) for b in (first, second, third)]
        while second.state is not State.GIVEN_BACK:
            await asyncio.sleep(0.01)
        assert deliveries.holds.held("k")
        await asyncio.sleep(0.05)  # the third batch is handed over, behind the first
        sink.gate.set()  # the backlog clears: the first batch's events are admitted now
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    sent = [e.id for e in sink.delivered]
    assert sent == [1, 2] or sent[:4] == [1, 2, 3, 4], f"k:5 reached the sink past k:3 and k:4, given back: {sent}"
