"""A batch that ends while a claim's answer is on its way wakes the idle after that claim.

The loop idles after a claim that came back short, until a batch in hand
ends, a NOTIFY, or the poll interval. A batch's end frees its keys' next
events, so it must wake that idle even when it came before the idle began:
between the claim's snapshot and its answer (the database's round trip, the
events being built). A wake cleared at the idle's start was lost there, and
the next events of those keys waited out a whole poll interval (on MySQL,
which has no NOTIFY, every keyed drain whose claims came back short).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

import pytest

from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim, Started
from relay.store.memory import MemoryStore
from tests.relay_support import FAST

POLL_SECONDS = 5.0
#: One event a claim, and a poll interval far longer than the test may take.
SETTINGS = replace(FAST, batch_size=1, poll_interval_seconds=POLL_SECONDS, poll_interval_max_seconds=POLL_SECONDS)


class AnswerOnItsWay(MemoryStore):
    """Each claim is made at once, and its answer arrives ``delay`` seconds later (a round trip)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        started = await super().start_claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        await asyncio.sleep(self.delay)
        return started


class Unchained(MemorySink):
    """A sink that keeps no key's order across batches: a key's next event waits for its batch's end."""

    chains_keys = False


@pytest.mark.parametrize("delay", [0.02, 0.2])
@pytest.mark.parametrize("events", [2, 5])
def test_a_key_s_next_event_goes_when_its_batch_ends_not_a_poll_interval_later(delay: float, events: int) -> None:
    store, sink = AnswerOnItsWay(delay), Unchained()
    for i in range(events):
        store.insert("t", {"i": i}, key="k")
    relay = Relay(store, sink, SETTINGS)

    async def main() -> float:
        stop = asyncio.Event()
        started = time.monotonic()
        task = asyncio.create_task(relay.run(stop))
        try:
            async with asyncio.timeout(events * POLL_SECONDS + 10):
                while store.rows:
                    await asyncio.sleep(0.005)
                    if task.done():
                        task.result()
            return time.monotonic() - started
        finally:
            stop.set()
            await task

    took = asyncio.run(main())
    assert [e.id for e in sink.delivered] == list(range(1, events + 1))
    # Each event needs a claim or two of ``delay``; a lost wake costs a poll interval per event.
    assert took < POLL_SECONDS / 2, f"{events} events of one key took {took:.2f} s"
