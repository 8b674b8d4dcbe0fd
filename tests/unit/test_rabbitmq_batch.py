"""The RabbitMQ sink's batch bookkeeping: a key's events are handed out one at a time.

A simulated broker confirms what was sent in random order and fails some of
it; whatever it does, a key never has two messages waiting for a confirm, a
key's events go out in order, and nothing of a key goes out after one of its
events failed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from relay.events import HELD, Event, Failure
from relay.holds import KeyHolds
from relay.sinks.rabbitmq.batch import Batch

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def claimed(keys: list[str | None]) -> list[Event]:
    """Events as a claim hands out runs: each after the first of its key is ``chained``."""
    seen: set[str] = set()
    events = []
    for n, key in enumerate(keys):
        event = Event(n, "t", key, b"{}", {}, f"id-{n}", 0, datetime.now(UTC))
        events.append(replace(event, chained=key in seen))
        if key is not None:
            seen.add(key)
    return events


def test_only_the_first_of_each_key_and_those_without_one_are_ready(loop: asyncio.AbstractEventLoop) -> None:
    batch = Batch(claimed(["a", "a", None, "b", "a", None, "b"]), loop, None)

    assert batch.take_ready() == [0, 2, 3, 5]
    batch.resolve(0, None, settled=True)
    assert batch.take_ready() == [1]
    batch.resolve(3, Failure("nacked"), settled=True)
    assert batch.outcomes[6] == HELD and batch.take_ready() == []


@pytest.mark.parametrize("seed", range(20))
def test_a_key_never_has_two_unconfirmed_messages(loop: asyncio.AbstractEventLoop, seed: int) -> None:
    rng = random.Random(seed)
    keys: list[str | None] = [rng.choice(["a", "b", "c", "d", None]) for _ in range(200)]
    events = claimed(keys)
    holds = KeyHolds()
    batch = Batch(events, loop, holds)
    unconfirmed: dict[int, str | None] = {}
    sent: list[int] = []
    failed: set[str] = set()
    while batch.unresolved:
        for index in batch.take_ready():
            if not holds.admit(events[index]):
                batch.resolve(index, HELD, settled=False)
                continue
            key = events[index].key
            assert key is None or key not in unconfirmed.values(), f"{key} has two unconfirmed messages"
            assert key not in failed, f"{key} went on after a failure"
            unconfirmed[index] = key
            sent.append(index)
        # The broker answers some of what is in flight, in any order (acks are not
        # ordered across keys here), and fails one in ten.
        answered = rng.sample(sorted(unconfirmed), k=rng.randint(1, len(unconfirmed)))
        for index in answered:
            key = unconfirmed.pop(index)
            if rng.random() < 0.1:
                batch.resolve(index, Failure("nacked"), settled=True)
                if key is not None:
                    failed.add(key)
            else:
                batch.resolve(index, None, settled=True)

    for key in {"a", "b", "c", "d"}:
        of_key = [i for i in sent if keys[i] == key]
        assert of_key == sorted(of_key), "a key's events went out in order"
        assert holds.held(key) == (key in failed)
        if key in failed:
            first_failure = next(i for i in of_key if batch.outcomes[i] is not None)
            later = [i for i, k in enumerate(keys) if k == key and i > first_failure]
            assert all(batch.outcomes[i] == HELD for i in later)
    # Events without a key all went out at once, the first time.
    assert [i for i in sent if keys[i] is None] == [i for i, k in enumerate(keys) if k is None]


def test_a_suspect_keeps_its_key_waiting_until_cleared_or_convicted(loop: asyncio.AbstractEventLoop) -> None:
    events = claimed(["a", "a", "b", "b"])
    holds = KeyHolds()
    batch = Batch(events, loop, holds)
    assert batch.take_ready() == [0, 2]
    batch.suspect([0, 2], "channel closed in refusal")
    assert batch.take_ready() == [] and not holds.held("a") and not holds.held("b")

    batch.retry([0])
    batch.resolve(0, None, settled=True)  # cleared: the next of its key is ready
    assert batch.take_ready() == [1]
    batch.retry([2])
    batch.suspect([2], "refused again")
    batch.convict(2, Failure("refused by RabbitMQ"))
    assert batch.outcomes[3] == HELD and holds.held("b") and not holds.held("a")


def test_what_never_got_its_turn_goes_back_held(loop: asyncio.AbstractEventLoop) -> None:
    events = claimed(["a", "a", "a", None])
    holds = KeyHolds()
    batch = Batch(events, loop, holds)
    batch.sent.update(batch.take_ready())
    batch.resolve(3, None, settled=True)

    batch.time_out(sorted(batch.sent), "no confirm")
    batch.abandon("no time left")

    first = batch.outcomes[0]
    assert isinstance(first, Failure) and first.timed_out
    assert batch.outcomes[1:3] == [HELD, HELD] and batch.outcomes[3] is None
    assert holds.held("a")
    assert batch.unacknowledged() == events[:3]
