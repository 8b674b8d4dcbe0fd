"""The sink contract (:class:`relay.sinks.base.Sink`), run against every sink.

Each test runs once per sink kind (the ``sh`` fixture): memory, Kafka,
RabbitMQ, a throwaway kind registered as the relay registers its own, and a
routing sink over two memory sinks. Batches are published as the relay's
pipeline does: the next batch's ``publish`` is called before the first
returns, with one :class:`relay.holds.KeyHolds` shared, and events after the
first of a key in the relay's hands ``chained``.

The key-order checks fail for every sink once the shared per-key piece
(:mod:`relay.sinks.keyorder`) keeps no holds: see the last test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest

from relay.errors import SinkError
from relay.events import HELD, Event, Outcome
from relay.holds import KeyHolds
from relay.sinks.base import Sink
from relay.sinks.keyorder import Turns
from tests.conformance.sink_harness import SinkHarness, harness_for

pytestmark = pytest.mark.timeout(60)


#: Every kind under the contract; each chains keys.
KINDS = ["memory", "kafka", "rabbitmq", "throwaway", "routing"]


@pytest.fixture(params=KINDS)
def sh(request: pytest.FixtureRequest) -> Iterator[SinkHarness]:
    with harness_for(request.param, lambda: request.getfixturevalue("amqp_url")) as harness:
        yield harness


def interleaved(sh: SinkHarness, keys: list[str], per_key: int, seen: set[str], *, keyless: int = 0) -> list[Event]:
    """``per_key`` events of each key, interleaved, then ``keyless`` events without a key; chained as a
    claim marks them (``seen``: the keys with events in the relay's hands, updated)."""
    events = []
    for _ in range(per_key):
        for key in keys:
            events.append(sh.event(key, chained=key in seen))
            seen.add(key)
    return events + [sh.event(None, chained=False) for _ in range(keyless)]


async def started(sh: SinkHarness) -> Sink:
    sink = sh.sink()
    await sink.start()
    return sink


def publish_together(sh: SinkHarness, batches: list[list[Event]], holds: KeyHolds) -> list[list[Outcome]]:
    """Start a sink, publish ``batches`` at once (each call made before the one before it returned), close."""

    async def scenario() -> list[list[Outcome]]:
        sink = await started(sh)
        try:
            return list(await asyncio.gather(*(sink.publish(batch, holds) for batch in batches)))
        finally:
            await sink.close()

    return asyncio.run(scenario())


def assert_no_overtaking(calls: list[tuple[list[Event], list[Outcome] | BaseException]]) -> None:
    """The order contract, over ``publish`` calls in the order made: no event of a key is acknowledged
    after an earlier one of its key was not (a call that raised acknowledged nothing), unless it is
    not chained, which starts its key afresh."""
    broken: dict[str, str] = {}  # key -> the first of its events not acknowledged
    for events, result in calls:
        for index, event in enumerate(events):
            key = event.key
            if key is None:
                continue
            if not event.chained:
                broken.pop(key, None)
            acknowledged = isinstance(result, list) and result[index] is None
            if not acknowledged:
                broken.setdefault(key, event.idempotency_key)
            elif key in broken:
                raise AssertionError(
                    f"key {key!r}: {event.idempotency_key} acknowledged after {broken[key]} was not (it overtook)"
                )


def expected(events: list[Event], outcomes: list[Outcome]) -> dict[str, list[str]]:
    """Each key's idempotency keys, in order, of the events acknowledged."""
    out: dict[str, list[str]] = {}
    for event, outcome in zip(events, outcomes, strict=True):
        if outcome is None and event.key is not None:
            out.setdefault(event.key, []).append(event.idempotency_key)
    return out


def test_every_event_gets_one_outcome_in_order_and_each_key_arrives_in_order(sh: SinkHarness) -> None:
    seen: set[str] = set()
    batches = [interleaved(sh, ["a", "b", "c"], 5, seen, keyless=3) for _ in range(3)]
    holds = KeyHolds()

    results = publish_together(sh, batches, holds)

    assert [len(r) for r in results] == [len(b) for b in batches]
    assert all(outcome is None for outcomes in results for outcome in outcomes), results
    everything = [e for b in batches for e in b]
    assert sh.received(len(everything)) == expected(everything, [None] * len(everything))
    assert holds.snapshot() == frozenset()


def test_event_n_of_a_key_fails_so_its_later_events_and_next_batch_are_held_and_other_keys_go_on(
    sh: SinkHarness,
) -> None:
    seen: set[str] = set()
    first = interleaved(sh, ["a", "p", "b"], 4, seen)
    p_events = [i for i, e in enumerate(first) if e.key == "p"]
    poisoned = p_events[1]
    first[poisoned] = sh.poison(first[poisoned])
    second = interleaved(sh, ["a", "p", "b"], 3, seen, keyless=2)
    holds = KeyHolds()

    one, two = publish_together(sh, [first, second], holds)

    assert len(one) == len(first) and len(two) == len(second)
    failure = one[poisoned]
    assert failure is not None and not failure.held, failure
    assert_no_overtaking([(first, one), (second, two)])
    for index, (event, outcome) in enumerate(zip(first, one, strict=True)):
        if index == poisoned:
            continue
        want = HELD if event.key == "p" and index > poisoned else None
        assert outcome == want, (index, event.key, outcome)
    for event, outcome in zip(second, two, strict=True):
        assert outcome == (HELD if event.key == "p" else None), (event.key, outcome)
    assert holds.held("p") and not holds.held("a") and not holds.held("b")
    # Only what was acknowledged reached the broker (the held events were never sent), each key in order.
    acknowledged = expected(first + second, one + two)
    assert sh.received(sum(map(len, acknowledged.values())) + 2) == acknowledged


def test_a_timeout_answers_or_raises_for_every_event_and_holds_every_key_it_did_not_acknowledge(
    sh: SinkHarness,
) -> None:
    holds = KeyHolds()
    seen: set[str] = set()
    warm = interleaved(sh, ["a", "b"], 1, seen)
    stuck = interleaved(sh, ["a", "b"], 3, seen)

    async def scenario() -> None:
        sink = await started(sh)
        try:
            assert await sink.publish(warm, holds) == [None, None]
            result = await sh.outage("stall", lambda: sink.publish(stuck, holds))
            assert_unacknowledged(result, stuck, holds)
            # The broker answers again: a chained event of a held key is still not sent.
            assert await sink.publish([sh.event("a", chained=True)], holds) == [HELD]
            # Given back and claimed again, the key starts afresh from its first event.
            fresh = interleaved(sh, ["a"], 2, set())
            assert await sink.publish(fresh, holds) == [None, None]
        finally:
            await sink.close()

    asyncio.run(scenario())


def test_a_broker_that_goes_away_answers_or_raises_for_every_event_and_holds_every_key(sh: SinkHarness) -> None:
    holds = KeyHolds()
    seen: set[str] = set()
    warm = interleaved(sh, ["a", "b"], 1, seen)
    cut_off = interleaved(sh, ["a", "b"], 3, seen, keyless=1)

    async def scenario() -> None:
        sink = await started(sh)
        try:
            assert await sink.publish(warm, holds) == [None, None]
            result = await sh.outage("gone", lambda: sink.publish(cut_off, holds))
            assert_unacknowledged(result, cut_off, holds)
        finally:
            await sink.close()

    asyncio.run(scenario())


def assert_unacknowledged(result: list[Outcome] | SinkError, events: list[Event], holds: KeyHolds) -> None:
    """``publish`` raised, or answered every event, in order, without acknowledging it; either way each
    key of ``events`` is held (a raise gives the whole batch back)."""
    if isinstance(result, list):
        assert len(result) == len(events)
        assert all(outcome is not None for outcome in result), result
    for key in {e.key for e in events if e.key is not None}:
        assert holds.held(key), (key, result)


def test_close_with_batches_in_flight_answers_each_call_and_acknowledges_nothing_behind_what_it_did_not(
    sh: SinkHarness,
) -> None:
    holds = KeyHolds()
    seen: set[str] = set()
    batches = [interleaved(sh, ["a", "p", "b"], 10, seen, keyless=5) for _ in range(3)]
    # p's second event is never acknowledged: nothing of p after it may be, in its batch or the next two.
    poisoned = [i for i, e in enumerate(batches[0]) if e.key == "p"][1]
    batches[0][poisoned] = sh.poison(batches[0][poisoned])

    async def scenario() -> list[list[Outcome] | BaseException]:
        sink = await started(sh)
        publishing = [asyncio.ensure_future(sink.publish(batch, holds)) for batch in batches]
        await asyncio.sleep(0)
        await sink.close()
        await sink.close()  # safe twice
        return list(await asyncio.gather(*publishing, return_exceptions=True))

    results = asyncio.run(scenario())

    assert_no_overtaking(list(zip(batches, results, strict=True)))
    for batch, result in zip(batches, results, strict=True):
        if isinstance(result, BaseException):
            assert isinstance(result, SinkError), result
            # A raise gives the whole batch back: every key of it is held.
            assert all(holds.held(e.key) for e in batch if e.key is not None), result
            continue
        assert len(result) == len(batch)
        for event, outcome in zip(batch, result, strict=True):
            if outcome is not None and event.key is not None:
                assert holds.held(event.key), (event.key, outcome)
    assert holds.held("p")


@pytest.mark.parametrize(
    "check",
    [
        test_event_n_of_a_key_fails_so_its_later_events_and_next_batch_are_held_and_other_keys_go_on,
        test_close_with_batches_in_flight_answers_each_call_and_acknowledges_nothing_behind_what_it_did_not,
    ],
    ids=["event-n-fails", "close-in-flight"],
)
def test_the_key_order_checks_fail_when_the_sink_keeps_no_holds(
    sh: SinkHarness, check: Callable[[SinkHarness], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The per-key piece every sink uses admits everything and holds nothing: the sink's own way of
    # chaining (RabbitMQ's wait for the confirm before, Kafka's single produce thread) is left as it is.
    monkeypatch.setattr(Turns, "admit", lambda self, index: True)
    monkeypatch.setattr(Turns, "hold", lambda self, indices: None)

    with pytest.raises(AssertionError, match="it overtook"):
        check(sh)
