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
from relay.sinks.keyorder import KeyOrder
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
    assert [e for e, o in zip(events, batch.outcomes, strict=True) if o is not None] == events[:3]


def chained_batches(loop: asyncio.AbstractEventLoop, keys: list[list[str | None]], holds: KeyHolds) -> list[Batch]:
    """Batches as the sink takes them from claims that go on from the ones before: a key's events in a
    later batch are chained, and its first there waits for its last in the batches before (as in publish)."""
    batches: list[Batch] = []
    tails = KeyOrder()
    seen: set[str] = set()
    n = 0
    for layout in keys:
        events = []
        for key in layout:
            events.append(Event(n, "t", key, b"{}", {}, f"id-{n}", 0, datetime.now(UTC), chained=key in seen))
            n += 1
            if key is not None:
                seen.add(key)
        batch = Batch(events, loop, holds)
        tails.enter(batch.turns)
        batch.after()
        batches.append(batch)
    return batches


@pytest.mark.parametrize("seed", range(30))
def test_across_batches_a_key_has_one_unconfirmed_message_keeps_its_order_and_stops_at_a_failure(
    loop: asyncio.AbstractEventLoop, seed: int
) -> None:
    rng = random.Random(seed)
    layouts: list[list[str | None]] = [[rng.choice(["a", "b", "c", None]) for _ in range(30)] for _ in range(4)]
    holds = KeyHolds()
    batches = chained_batches(loop, layouts, holds)
    give_up = rng.randrange(len(batches)) if rng.random() < 0.3 else None  # a batch whose time runs out
    unconfirmed: dict[tuple[int, int], str | None] = {}
    sent: list[Event] = []
    failed: set[str] = set()
    while any(batch.unresolved for batch in batches):
        for b, batch in enumerate(batches):
            for index in batch.take_ready():
                event = batch.events[index]
                if not holds.admit(event):
                    batch.resolve(index, HELD, settled=False)
                    continue
                assert event.key is None or event.key not in unconfirmed.values(), f"{event.key}: two unconfirmed"
                assert event.key not in failed, f"{event.key} went on after a failure"
                unconfirmed[b, index] = event.key
                batch.sent.add(index)
                sent.append(event)
        if give_up is not None and rng.random() < 0.2:
            batch = batches[give_up]
            # What it had not settled yet goes back: those keys stop, as after a failure.
            failed.update(e.key for i, e in enumerate(batch.events) if i in batch.unresolved and e.key is not None)
            batch.time_out(sorted(batch.sent), "no confirm")
            for b, i in [bi for bi in unconfirmed if bi[0] == give_up]:
                del unconfirmed[b, i]
            batch.abandon("no time left")
            give_up = None
            continue
        if not unconfirmed:
            continue
        for b, index in rng.sample(sorted(unconfirmed), k=rng.randint(1, len(unconfirmed))):
            key = unconfirmed.pop((b, index))
            if rng.random() < 0.08:
                batches[b].resolve(index, Failure("nacked"), settled=True)
                failed.update([key] if key is not None else [])
            else:
                batches[b].resolve(index, None, settled=True)

    everything = [(e, batch.outcomes[i]) for batch in batches for i, e in enumerate(batch.events)]
    for key in ("a", "b", "c"):
        ids = [e.id for e in sent if e.key == key]
        assert ids == sorted(ids), f"{key}'s events went out in claim order, across batches"
        assert holds.held(key) == (key in failed)
        ended = [(e.id, o) for e, o in everything if e.key == key]
        first_bad = next((n for n, (_, o) in enumerate(ended) if o is not None), None)
        if first_bad is not None:
            # Nothing of the key after its first event that was not acknowledged went out, nor was acknowledged.
            later = ended[first_bad + 1 :]
            assert not {i for i, _ in later} & {e.id for e in sent}, f"{key} went out after a failure"
            assert all(isinstance(o, Failure) and o.held for _, o in later), f"{key}: {later}"
    assert not any(batch.waiting for batch in batches)


def test_a_key_waits_for_the_batch_before_and_goes_on_only_after_its_confirm(
    loop: asyncio.AbstractEventLoop,
) -> None:
    holds = KeyHolds()
    first, second = chained_batches(loop, [["a", "b"], ["a", "b", None]], holds)
    assert first.take_ready() == [0, 1]
    assert second.take_ready() == [2]  # a and b wait for the first batch; the event without a key does not
    assert second.waiting == {0, 1}
    first.resolve(0, None, settled=True)
    assert second.take_ready() == [0]
    first.resolve(1, Failure("returned: NO_ROUTE"), settled=True)
    # b's next is released, and the holds stop it: b is held since the failure.
    assert second.take_ready() == [1] and holds.held("b") and not holds.admit(second.events[1])


def test_a_batch_that_ends_in_an_exception_releases_the_next_one_to_its_holds(
    loop: asyncio.AbstractEventLoop,
) -> None:
    holds = KeyHolds()
    first, second = chained_batches(loop, [["a"], ["a"]], holds)
    first.sent.update(first.take_ready())
    assert second.take_ready() == []
    first.turns.end()  # as the sink does on its way out of a publish that raised
    assert second.take_ready() == [0] and not holds.admit(second.events[0])
