"""After a publish timeout, only a batch the broker acknowledged counts as "acknowledged in time".

A batch whose outcomes are all held, unavailable or refused says nothing of the
broker's health: it neither grows the shrunk batch size back nor ends the
timeouts' backoff (it did, and the log said the broker acknowledged in time
again 3 ms after a timeout). See relay.sinks.base and docs/how-it-works.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import pytest

from relay.errors import SinkTimeout
from relay.events import HELD, Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.loop import Relay
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST

UNAVAILABLE = Failure("its route's broker is down", unavailable=True, retry_after_seconds=1.0)
REFUSED = Failure("message too large", permanent=True)
RETRY = Failure("broker said no")


class ScriptedSink:
    """Answers each ``publish`` with the next of ``script``: outcomes for each event, or an error."""

    name = "scripted"
    chains_keys = True

    def __init__(self, script: list[Callable[[Sequence[Event]], list[Outcome]]]) -> None:
        self.script = script

    async def start(self) -> None:
        pass

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        return self.script.pop(0)(events)

    async def check(self) -> None:
        pass

    async def close(self) -> None:
        pass


def times_out(events: Sequence[Event]) -> list[Outcome]:
    raise SinkTimeout("no acknowledgement within the publish timeout")


def each(*outcomes: Outcome) -> Callable[[Sequence[Event]], list[Outcome]]:
    """Outcomes cycling over ``outcomes``, one per event."""
    return lambda events: [outcomes[i % len(outcomes)] for i in range(len(events))]


def after_a_timeout(second: Callable[[Sequence[Event]], list[Outcome]]) -> Relay:
    """A relay that published a batch that timed out, then a second batch answered by ``second``."""
    store = MemoryStore()
    for i in range(6):
        store.insert("t", {"i": i}, key=f"k{i}")
    relay = Relay(store, ScriptedSink([times_out, second]), FAST)

    async def scenario() -> None:
        for _ in range(2):
            claim = await store.claim(3, max_attempts=FAST.max_attempts)
            assert len(claim.events) == 3
            await relay.deliveries.deliver(relay.deliveries.take(claim, time.monotonic()))

    asyncio.run(scenario())
    return relay


@pytest.mark.parametrize(
    "second",
    [each(HELD), each(UNAVAILABLE), each(REFUSED), each(RETRY), each(HELD, UNAVAILABLE, REFUSED)],
    ids=["all held", "all unavailable", "all refused", "all failed", "held, unavailable, refused"],
)
def test_a_batch_with_nothing_acknowledged_does_not_end_the_timeouts(
    second: Callable[[Sequence[Event]], list[Outcome]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="relay.batch"):
        relay = after_a_timeout(second)

    assert relay.costs.timeouts.failures == 1
    assert relay.limits.shrunk_by_timeouts
    assert not [r for r in caplog.records if getattr(r, "action", None) == "timeouts_over"]


@pytest.mark.parametrize("second", [each(None), each(None, HELD, HELD)], ids=["all acknowledged", "one acknowledged"])
def test_a_batch_the_broker_acknowledged_counts_as_in_time(
    second: Callable[[Sequence[Event]], list[Outcome]], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="relay.batch"):
        relay = after_a_timeout(second)

    assert not relay.limits.shrunk_by_timeouts
    assert relay.costs.timeouts.failures == 0
    assert [r for r in caplog.records if getattr(r, "action", None) == "timeouts_over"]
