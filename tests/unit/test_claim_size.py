"""How much a claim takes: the byte cap, and the loop shrinking its claims when they time out (no I/O)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.batching import BatchLimits
from relay.errors import ClaimTimeout
from relay.events import Event, Outcome
from relay.holds import KeyHolds
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, run_until


def payload_of(size: int) -> str:
    """A JSON string payload whose encoding is exactly ``size`` bytes (``size`` >= 2)."""
    return "x" * (size - 2)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=2, max_value=5000), min_size=1, max_size=30),
    max_bytes=st.integers(min_value=1, max_value=40_000),
    limit=st.integers(min_value=1, max_value=40),
)
def test_a_claim_stops_adding_events_once_their_payloads_reach_the_cap(
    sizes: list[int], max_bytes: int, limit: int
) -> None:
    store = MemoryStore()
    for size in sizes:
        store.insert("t", payload_of(size))
    claim = asyncio.run(store.claim(limit, max_attempts=5, max_bytes=max_bytes))
    taken = [len(e.payload) for e in claim.events]
    assert taken == sizes[: len(taken)]
    assert 1 <= len(taken) <= limit
    # Every event but the last was added while the batch was still under the cap ...
    assert sum(taken[:-1]) < max_bytes
    # ... and a claim that left due events behind stopped at the count or at the cap.
    if len(taken) < min(limit, len(sizes)):
        assert sum(taken) >= max_bytes


class SlowReadStore(MemoryStore):
    """Reads payloads at ``bytes_per_second``; a claim that would read longer than
    ``statement_timeout`` seconds times out, as PostgreSQL's does, and leases nothing."""

    def __init__(self, bytes_per_second: float, statement_timeout: float) -> None:
        super().__init__()
        self.rate = bytes_per_second
        self.statement_timeout = statement_timeout
        self.timeouts = 0
        self.claimed: list[tuple[int, int]] = []
        #: The most payload bytes leased at once (the batches in hand).
        self.most_in_hand = 0

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        claim = await super().claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        size = sum(len(e.payload) for e in claim.events)
        if size / self.rate > self.statement_timeout:
            await asyncio.sleep(self.statement_timeout)
            await self.release(claim, [e.id for e in claim.events])  # the statement rolled back
            self.timeouts += 1
            raise ClaimTimeout("canceling statement due to statement timeout")
        await asyncio.sleep(size / self.rate)
        if claim.events:
            self.claimed.append((len(claim.events), size))
        in_hand = sum(len(json.dumps(r.payload)) for r in self.rows.values() if r.claim_token is not None)
        self.most_in_hand = max(self.most_in_hand, in_hand)
        return claim


FAST_CLAIMS = replace(FAST, batch_size=16)


def test_a_claim_that_times_out_shrinks_until_it_fits_and_grows_back_when_claims_are_fast() -> None:
    # 10 kB events read at 100 kB/s under a 0.25 s statement timeout: two fit in a claim, three do not.
    store, sink = SlowReadStore(bytes_per_second=100_000, statement_timeout=0.25), MemorySink()
    for _ in range(30):
        store.insert("t", payload_of(10_000))
    relay = Relay(store, sink, FAST_CLAIMS)

    async def scenario() -> None:
        await run_until(relay, lambda: not store.rows, timeout=20)
        # 16 -> 8 -> 4 -> 2 events: three timeouts, then claims that fit and stay that size.
        assert store.timeouts == 3, store.claimed
        assert {count for count, _ in store.claimed} == {2}, store.claimed
        # Small events read fast: the batch grows back to the configured size.
        for _ in range(100):
            store.insert("t", payload_of(10))
        await run_until(relay, lambda: not store.rows, timeout=20)

    asyncio.run(scenario())
    assert store.timeouts == 3
    assert max(count for count, _ in store.claimed) == FAST_CLAIMS.batch_size
    assert len(sink.delivered) == 130 and all(e.attempts == 1 for e in sink.delivered)


def test_batches_in_hand_hold_at_most_the_byte_cap_per_pipeline_slot() -> None:
    payload = 10_000
    limits = replace(FAST_CLAIMS, batch_bytes=25_000)
    store = SlowReadStore(bytes_per_second=1e9, statement_timeout=1.0)
    for _ in range(60):
        store.insert("t", payload_of(payload))

    class SlowSink(MemorySink):
        async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
            await asyncio.sleep(0.02)
            return await super().publish(events, holds)

    asyncio.run(run_until(Relay(store, SlowSink(), limits), lambda: not store.rows, timeout=20))
    # A claim stops once its payloads reach the cap: under the cap plus one event.
    assert max(size for _, size in store.claimed) < limits.batch_bytes + payload
    assert store.most_in_hand < limits.pipeline_depth * (limits.batch_bytes + payload)
    assert max(count for count, _ in store.claimed) == 3


def test_the_count_follows_what_the_byte_cap_let_the_last_claim_take() -> None:
    limits = BatchLimits(4000, 16_000_000)
    assert limits.count == 4000
    limits.took(1000, 16_000_000)  # 16 kB events: the cap stops a claim at about 1,000
    assert limits.count == 1250  # the margin over what fits
    limits.took(4000, 600_000)  # small ones again: back to the configured count
    assert limits.count == 4000
    limits.took(1, 40_000_000)  # one event larger than the cap: a claim of one, once
    assert limits.count == 1
    limits.took(1, 150)
    assert limits.count == 4000
    limits.took(0, 0)  # an empty claim says nothing of sizes
    assert limits.count == 4000
    limits.took(3, 0)  # payloads of no bytes: the count alone
    assert limits.count == 4000
    limits.took(1000, 16_000_000)
    limits.claim_timed_out(1.0)  # halvings halve the byte cap, and the fitted count with it
    assert (limits.count, limits.max_bytes) == (625, 8_000_000)


class CountingStore(MemoryStore):
    """Records the count each claim asked for, and what it took."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[int, int]] = []

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        claim = await super().claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        if claim.events:
            self.asked.append((limit, len(claim.events)))
        return claim


def test_claims_of_large_payloads_ask_for_about_what_the_byte_cap_lets_in() -> None:
    store, sink = CountingStore(), MemorySink()
    for _ in range(40):
        store.insert("t", payload_of(10_000))
    settings = replace(FAST_CLAIMS, batch_size=16, batch_bytes=25_000)
    relay = Relay(store, sink, settings)

    async def scenario() -> None:
        await run_until(relay, lambda: not store.rows, timeout=20)
        # 10 kB events under a 25 kB cap: 3 a claim; after the first, claims ask for 4, not 16.
        assert store.asked[0] == (16, 3), store.asked
        assert {asked for asked, _ in store.asked[1:]} == {4}, store.asked
        assert all(took == 3 for _, took in store.asked[:-1]), store.asked
        store.asked.clear()
        for _ in range(100):
            store.insert("t", payload_of(10))
        await run_until(relay, lambda: not store.rows, timeout=20)

    asyncio.run(scenario())
    # Small events: one claim at the fitted count, then the configured count again.
    assert store.asked[0] == (4, 4), store.asked
    assert max(asked for asked, _ in store.asked) == 16
    assert len(sink.delivered) == 140


def test_claims_of_large_headers_ask_for_about_what_the_byte_cap_lets_in() -> None:
    store, sink = CountingStore(), MemorySink()
    for _ in range(40):
        store.insert("t", {}, headers={"trace": "x" * 10_000})
    settings = replace(FAST_CLAIMS, batch_size=16, batch_bytes=25_000)
    asyncio.run(run_until(Relay(store, sink, settings), lambda: not store.rows, timeout=20))
    # Small payloads, 10 kB of headers each: the headers fill the cap, and the count follows them too.
    assert store.asked[0][0] == 16 and {asked for asked, _ in store.asked[1:]} == {4}, store.asked
    assert len(sink.delivered) == 40
