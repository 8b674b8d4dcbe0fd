"""Runs of a key's events, chained across batches in flight, on the in-memory store and sink."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

from relay.events import HELD, Event, Failure, Outcome
from relay.holds import KeyHolds, mark_chained
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import chained_keys
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, go, run_until

PIPELINED = replace(FAST, batch_size=7, pipeline_depth=3)


class SlowSink(MemorySink):
    """Acknowledges after a pause, so that several batches are in flight at once."""

    def __init__(self, fail: object = None) -> None:
        super().__init__(fail)  # type: ignore[arg-type]
        self.batches: list[list[Event]] = []

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        self.batches.append(list(events))
        outcomes = await super().publish(events, holds)
        await asyncio.sleep(0.01)
        return outcomes


def failing(failures: dict[int, int]) -> Callable[[Event], Outcome]:
    """A sink's outcome for each event: a failure for each of ``failures[id]`` first attempts."""

    def outcome(event: Event) -> Outcome:
        if failures.get(event.id, 0) > 0:
            failures[event.id] -= 1
            return Failure("broker hiccup")
        return None

    return outcome


def first_copies(sink: MemorySink, key: str) -> list[int]:
    seen: list[int] = []
    for event in sink.delivered:
        if event.key == key and event.id not in seen:
            seen.append(event.id)
    return seen


def test_a_hot_key_moves_in_runs_chained_across_the_batches_in_flight() -> None:
    store, sink = MemoryStore(), SlowSink()
    for i in range(60):
        store.insert("t", {"i": i}, key="hot")
    go(run_until(Relay(store, sink, PIPELINED), lambda: not store.rows))
    assert first_copies(sink, "hot") == sorted(first_copies(sink, "hot"))
    assert len(first_copies(sink, "hot")) == 60
    # Whole batches of the one key, and the later ones claimed while earlier ones were in flight.
    assert max(len(b) for b in sink.batches) == 7
    assert any(b[0].chained for b in sink.batches)


def test_a_failure_in_a_run_holds_the_rest_of_its_key_in_flight_and_nothing_overtakes_it() -> None:
    store, sink = MemoryStore(), SlowSink(failing({13: 1, 29: 2}))
    for i in range(80):
        store.insert("t", {"i": i}, key=f"k{i % 2}")
    go(run_until(Relay(store, sink, PIPELINED), lambda: not store.rows))
    for key in ("k0", "k1"):
        assert first_copies(sink, key) == sorted(first_copies(sink, key))
        assert len(first_copies(sink, key)) == 40
    # Every delivery of a key after a failure of it comes after that event was delivered.
    failed_at = [i for i, e in enumerate(sink.attempted) if e.id in (13, 29)]
    assert failed_at, "the failures never happened"
    for index, event in enumerate(sink.delivered):
        if event.key == "k0" and event.id > 13:
            assert any(e.id == 13 for e in sink.delivered[:index]), f"event {event.id} overtook 13"
        if event.key == "k0" and event.id > 29:
            assert any(e.id == 29 for e in sink.delivered[:index]), f"event {event.id} overtook 29"


def test_a_poison_event_parks_its_key_and_the_other_keys_drain() -> None:
    store, sink = MemoryStore(), SlowSink(lambda e: Failure("too large", permanent=True) if e.id == 21 else None)
    for i in range(60):
        store.insert("t", {"i": i}, key=f"k{i % 3}")
    relay = Relay(store, sink, PIPELINED)
    parked = [i + 1 for i in range(60) if i % 3 == 2 and i + 1 > 21]
    go(run_until(relay, lambda: sorted(store.rows) == [21, *parked]))
    assert store.rows[21].state == "failed"
    assert all(store.rows[i].state == "pending" and store.rows[i].claim_token is None for i in parked)
    assert not [e for e in sink.delivered if e.id in parked]
    assert len(first_copies(sink, "k0")) == len(first_copies(sink, "k1")) == 20
    assert relay.holds.held("k2")


def test_holds_admit_unchained_events_and_clear_their_key() -> None:
    holds = KeyHolds()
    event = Event(1, "t", "k", b"{}", {}, "i", 1, None, chained=True)  # type: ignore[arg-type]
    assert holds.admit(event)
    holds.hold([event])
    assert not holds.admit(event)
    assert holds.admit(replace(event, chained=False)) and holds.admit(event)
    assert HELD.held and not HELD.permanent


def test_an_event_of_a_key_in_flight_here_is_chained_whatever_the_claim_saw() -> None:
    flying = Event(5, "t", "k", b"{}", {}, "a", 1, None)  # type: ignore[arg-type]
    late = Event(3, "t", "k", b"{}", {}, "b", 1, None)  # type: ignore[arg-type]  # a late commit below the chain
    other = Event(9, "t", "j", b"{}", {}, "c", 1, None)  # type: ignore[arg-type]
    mark_chained([late, other], [[flying]])
    assert late.chained and not other.chained
    holds = KeyHolds()
    holds.hold([flying])
    # So the late event cannot lift the hold that the event in flight put on its key.
    assert not holds.admit(late) and holds.held("k")


def test_a_hot_key_with_mixed_priorities_and_large_payloads_drains_in_order() -> None:
    store, sink = MemoryStore(), SlowSink()
    for i in range(40):
        store.insert("t", {"i": i, "pad": "x" * 20_000}, key="hot", priority=(i * 7) % 3)
        store.insert("t", {"i": i}, key=f"cold-{i % 3}", priority=2)
    relay = Relay(store, sink, replace(PIPELINED, batch_bytes=50_000))
    go(run_until(relay, lambda: not store.rows))
    for key in ("hot", "cold-0", "cold-1", "cold-2"):
        ids = first_copies(sink, key)
        assert ids == sorted(ids) and ids
    assert len(first_copies(sink, "hot")) == 40


class CountingSink(SlowSink):
    """Counts the events answered HELD (given back unsent, to be claimed again)."""

    def __init__(self, fail: object = None) -> None:
        super().__init__(fail)
        self.held = 0

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        outcomes = await super().publish(events, holds)
        self.held += sum(1 for outcome in outcomes if outcome is HELD)
        return outcomes


def test_a_retry_keeps_its_key_in_order_and_only_the_batches_in_hand_come_back_held() -> None:
    store, sink = MemoryStore(), CountingSink(failing({5: 1}))
    for i in range(300):
        store.insert("t", {"i": i}, key="hot")
    # The retry waits 0.5 s: long enough for many claims, had they gone on chaining the key.
    settings = replace(PIPELINED, backoff_initial_seconds=0.5, backoff_max_seconds=0.5)
    go(run_until(Relay(store, sink, settings), lambda: not store.rows, timeout=20))
    assert first_copies(sink, "hot") == list(range(1, 301))
    # What was in flight when event 5 failed comes back held, and no more: at most the batches in hand.
    assert 0 < sink.held <= settings.batch_size * (settings.pipeline_depth + 1), sink.held


def test_a_claim_does_not_go_on_from_the_events_of_a_key_on_hold() -> None:
    store = MemoryStore()
    for i in range(6):
        store.insert("t", {"i": i}, key="hot" if i % 2 else "cold")
    relay = Relay(store, MemorySink(), PIPELINED)
    claim = asyncio.run(store.claim(10, max_attempts=3))
    relay.deliveries.flying[claim.token] = (claim, 0.0)
    assert {e.key for c in relay.deliveries.chain(0.0) for e in c.events} == {"hot", "cold"}
    # Once a key is on hold, its next runs would only come back held: the claim starts it afresh
    # (from its oldest event, in flight here, so not at all) instead of chaining on.
    relay.holds.hold([e for e in claim.events if e.key == "hot"])
    chain = relay.deliveries.chain(0.0)
    assert [c.token for c in chain] == [claim.token]
    assert {e.key for c in chain for e in c.events} == {"cold"}
    assert not asyncio.run(store.claim(10, max_attempts=3, chain=chain)).events


def test_keys_as_many_as_a_batch_keep_their_order_through_retries_and_a_poison() -> None:
    """One event of each key in each batch: the claims go on with recurring keys that have one event in
    flight, and a failure of that one event still holds what was chained on it."""
    keys = PIPELINED.batch_size
    poison = 3 * keys + 2  # the fourth event of key k1
    failures = {2 * keys + 5: 1, 4 * keys + 6: 2}
    outcomes = failing(failures)
    store = MemoryStore()
    sink = CountingSink(lambda e: Failure("too large", permanent=True) if e.id == poison else outcomes(e))
    for i in range(20 * keys):
        store.insert("t", {"i": i}, key=f"k{i % keys}")
    relay = Relay(store, sink, PIPELINED)
    parked = [i for i in range(poison + keys, 20 * keys + 1, keys)]
    go(run_until(relay, lambda: sorted(store.rows) == [poison, *parked], timeout=20))
    assert failures == {2 * keys + 5: 0, 4 * keys + 6: 0}, "the failures never happened"
    for key in range(keys):
        got = first_copies(sink, f"k{key}")
        assert got == sorted(got), key
        assert len(got) == (poison // keys if key == 1 else 20), key
    # The claims went on with keys that had one event in flight: batches of one event per key, chained.
    assert any(len(b) == keys and len({e.key for e in b}) == keys and all(e.chained for e in b) for b in sink.batches)
    assert store.rows[poison].state == "failed" and relay.holds.held("k1")


def test_a_recurring_key_is_gone_on_with_unless_it_is_on_hold() -> None:
    store = MemoryStore()
    for i in range(4):
        store.insert("t", {"i": i}, key=f"k{i % 2}")
    relay = Relay(store, MemorySink(), PIPELINED)
    relay.sink.chains_keys = True
    claim = asyncio.run(store.claim(2, max_attempts=3))  # one event of k0 and one of k1
    relay.deliveries.flying[claim.token] = (claim, 0.0)
    assert not chained_keys(relay.deliveries.chain(0.0))  # nothing recurs yet: neither key is gone on with
    relay.deliveries.recent_keys.append(frozenset({"k0", "k1", "gone"}))
    assert set(chained_keys(relay.deliveries.chain(0.0))) == {"k0", "k1"}
    relay.holds.hold([e for e in claim.events if e.key == "k1"])
    assert set(chained_keys(relay.deliveries.chain(0.0))) == {"k0"}
    chain = relay.deliveries.chain(0.0)
    assert [e.key for e in asyncio.run(store.claim(10, max_attempts=3, chain=chain)).events] == ["k0"]
