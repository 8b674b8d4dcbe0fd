"""How much a claim takes: the byte cap, and the loop shrinking its claims when they time out (no I/O)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from relay.store.memory import MemoryStore


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
