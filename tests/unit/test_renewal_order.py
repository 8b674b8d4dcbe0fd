"""A batch that renews its lease sends no event of a key after an earlier one of it the batch lost.

The relay claims a run of each key, then stalls before publishing (its events take long to build,
a paused process) until it must renew the lease. Meanwhile events of the batch are lost: past the
lease another relay's reaper dead-letters those whose attempts reached the limit (history left a
key's later events with more attempts than its first: ``requeue``, ``replay``, a late commit), or,
while the lease holds, one is taken over, dead-lettered or settled. After the dead letters are
requeued and everything is delivered, the sink's log per key must never go backwards (issue 36).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from uuid import UUID, uuid4

import pytest

from relay.events import Event
from relay.holds import KeyHolds
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim, RequeueFilter, Started
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, run_until

MAX_ATTEMPTS = 3
#: How long the first batch's events take to build: past the (shortened) time a batch may start publishing.
STALL_SECONDS = 0.08
LATEST_PUBLISH_START_SECONDS = 0.04

Meanwhile = Callable[["StalledStore", Claim], Awaitable[None]]


class StalledStore(MemoryStore):
    """The first claim's events take ``STALL_SECONDS`` to build; ``meanwhile`` runs then, on that batch,
    after any claim started ahead of it went to the store (and chained on it)."""

    def __init__(self, meanwhile: Meanwhile) -> None:
        super().__init__(lease_seconds=FAST.lease_seconds)
        self.meanwhile: Meanwhile | None = meanwhile
        #: Each claim: its token and its events' (id, chained).
        self.claims: list[tuple[UUID, list[tuple[int, bool]]]] = []
        #: What each renewal kept.
        self.renewed: list[set[int]] = []
        #: Every event a claim handed out, as it did.
        self.handed_out: list[Event] = []

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        claim = await self.claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        if claim.events:
            self.claims.append((claim.token, [(e.id, e.chained) for e in claim.events]))
            self.handed_out.extend(claim.events)
        meanwhile, self.meanwhile = (self.meanwhile, None) if claim.events else (None, self.meanwhile)
        return _Stalled(self, claim, meanwhile)

    async def renew(self, claim: Claim) -> set[int]:
        kept = await super().renew(claim)
        self.renewed.append(kept)
        return kept

    def ids(self, key: str) -> list[int]:
        return sorted(r.id for r in self.rows.values() if r.key == key)


class _Stalled:
    def __init__(self, store: StalledStore, claim: Claim, meanwhile: Meanwhile | None) -> None:
        self._store, self._claim, self._meanwhile = store, claim, meanwhile
        self.token, self.rows = claim.token, len(claim.events)

    def tails(self) -> Claim:
        return self._claim

    async def events(self) -> Claim:
        if self._meanwhile is not None:
            await asyncio.sleep(STALL_SECONDS)
            await self._meanwhile(self._store, self._claim)
        return self._claim


async def reaped_after_the_lease(store: StalledStore, claim: Claim) -> None:
    """The batch's lease ends; another relay's reaper dead-letters what used its last attempt."""
    for event in claim.events:
        store.rows[event.id].lease_expires_at = store.now() - timedelta(seconds=1)
    await store.reap(max_attempts=MAX_ATTEMPTS)


def lost_while_leased(how: str, position: int) -> Meanwhile:
    """While the lease holds, the batch loses the ``position``-th event of key ``k`` (another relay
    took it over, a reaper dead-lettered it, or it was settled)."""

    async def lose(store: StalledStore, claim: Claim) -> None:
        row = store.rows[[e.id for e in claim.events if e.key == "k"][position]]
        if how == "taken":
            row.claim_token, row.lease_expires_at = uuid4(), store.now() + timedelta(seconds=60)
        elif how == "dead":
            row.state, row.claim_token = "failed", None
        else:  # settled: sent by the relay that had it, and deleted
            del store.rows[row.id]

    return lose


def write(store: StalledStore, keys: dict[str, Sequence[int]]) -> dict[int, tuple[str, int]]:
    """Each key's events, ids interleaved across keys, with the attempts history gave them;
    ``{id: (key, n)}``, n counting each key's events from 1."""
    written: dict[int, tuple[str, int]] = {}
    for n in range(max(map(len, keys.values()))):
        for key, attempts in keys.items():
            if n < len(attempts):
                event_id = store.insert("t", {"key": key, "n": n + 1}, key=key)
                store.rows[event_id].attempts = attempts[n]
                written[event_id] = (key, n + 1)
    return written


def relay_for(store: StalledStore, batch_size: int) -> tuple[Relay, MemorySink]:
    sink = MemorySink()
    relay = Relay(store, sink, replace(FAST, batch_size=batch_size, max_attempts=MAX_ATTEMPTS))
    # A lease short enough for the stall to outlast.
    relay.deliveries.latest_publish_start = LATEST_PUBLISH_START_SECONDS
    return relay, sink


def deliver_everything(store: StalledStore, relay: Relay, sink: MemorySink) -> None:
    """Relay until what can go went; then requeue the dead letters, hand back what another relay took,
    and relay until the outbox is empty."""

    def settled() -> bool:
        now = store.now()
        mine = {token for token, _ in store.claims}
        leased = any(
            r.claim_token in mine and r.lease_expires_at and r.lease_expires_at >= now for r in store.rows.values()
        )
        return not leased and all(
            r.state == "failed" or r.claim_token not in (None, *mine) or _behind_a_stop(store, r.id)
            for r in store.rows.values()
        )

    async def scenario() -> None:
        await run_until(relay, settled, timeout=10)
        await store.requeue(RequeueFilter(all=True))
        for row in store.rows.values():
            row.claim_token = row.lease_expires_at = None  # another relay gave back what it took
        await run_until(relay, lambda: not store.rows, timeout=10)

    asyncio.run(scenario())


def _behind_a_stop(store: StalledStore, event_id: int) -> bool:
    """Whether an earlier event of the row's key is dead or another relay's."""
    row = store.rows[event_id]
    mine = {token for token, _ in store.claims}
    return any(
        o.key == row.key and o.id < row.id and (o.state == "failed" or o.claim_token not in (None, *mine))
        for o in store.rows.values()
    )


def log_by_key(sink: MemorySink, written: dict[int, tuple[str, int]]) -> dict[str, list[int]]:
    """Each key's events as the sink got them, a copy of one it already had left out."""
    seen: set[int] = set()
    by_key: dict[str, list[int]] = {}
    for event in sink.delivered:
        if event.id not in seen:
            seen.add(event.id)
            key, n = written[event.id]
            assert json.loads(event.payload) == {"key": key, "n": n}
            by_key.setdefault(key, []).append(n)
    return by_key


def assert_in_order(sink: MemorySink, written: dict[int, tuple[str, int]], settled_elsewhere: int = 0) -> None:
    by_key = log_by_key(sink, written)
    for key, got in by_key.items():
        assert got == sorted(got), (key, got)
    assert sum(map(len, by_key.values())) == len(written) - settled_elsewhere


@pytest.mark.parametrize(
    "keys",
    [
        {"k": (0, 2, 2, 0)},  # the case: the middle of the run dead-lettered
        {"k": (2, 0, 0, 0)},  # its first
        {"k": (0, 0, 2, 2)},  # its end
        {"k": (0, 2, 0, 2, 0)},  # two holes
        {"k": (2, 2, 2, 2)},  # all of it
        {"k": (0, 0, 0, 0)},  # none: the lease ended and nobody took the rows
        {"a": (0, 2, 0), "b": (0, 0, 0), "c": (2, 0), "d": (0, 0, 2, 0)},  # several keys, each its own case
    ],
    ids=["middle", "first", "last", "two-holes", "all", "none", "several-keys"],
)
def test_a_renewal_after_a_reaper_dead_lettered_part_of_a_run_sends_nothing_past_it(
    keys: dict[str, Sequence[int]],
) -> None:
    store = StalledStore(reaped_after_the_lease)
    written = write(store, keys)
    relay, sink = relay_for(store, batch_size=len(written))
    deliver_everything(store, relay, sink)
    assert_in_order(sink, written)
    assert store.renewed[:1] == [set()], "past its lease, the stale batch renews nothing"


@pytest.mark.parametrize("how", ["dead", "taken", "settled"])
@pytest.mark.parametrize("position", [0, 1, 3])
def test_a_key_that_lost_an_event_in_a_renewal_sends_none_of_that_batch(how: str, position: int) -> None:
    # A loss while the lease holds cannot happen through the relay's own statements; whatever causes
    # one, the rule is the renewal's: no event of the key goes out from the batch, before or after it.
    store = StalledStore(lost_while_leased(how, position))
    written = write(store, {"k": (0, 0, 0, 0), "other": (0, 0)})
    relay, sink = relay_for(store, batch_size=len(written))
    lost = store.ids("k")[position]
    deliver_everything(store, relay, sink)
    assert_in_order(sink, written, settled_elsewhere=how == "settled")
    assert len(store.renewed[0]) == len(written) - 1, store.renewed
    # The stale batch sent its other key's events, and none of k's: they went back untried.
    stale = {id(e) for e in store.handed_out[: len(written)]}
    assert {e.key for e in sink.delivered if id(e) in stale} == {"other"}
    assert all(e.attempts == 1 for e in sink.delivered if e.id != lost), "given back without an attempt spent"
    if how == "settled":
        assert lost not in {e.id for e in sink.delivered}


@pytest.mark.parametrize(
    ("meanwhile", "attempts"),
    [
        (reaped_after_the_lease, (0, 2, 2, 0)),
        (reaped_after_the_lease, (0, 0, 0, 2)),  # the batch's tail, which the next batch went on from
        (lost_while_leased("dead", 1), (0, 0, 0, 0)),
        (lost_while_leased("taken", 2), (0, 0, 0, 0)),
    ],
    ids=["reaped-middle", "reaped-tail", "dead-while-leased", "taken-while-leased"],
)
def test_a_batch_chained_on_a_stale_one_sends_nothing_past_what_the_stale_one_lost(
    meanwhile: Meanwhile, attempts: tuple[int, ...]
) -> None:
    # The next claim went on with the stale batch's key while it was in hand (claimed ahead).
    store = StalledStore(meanwhile)
    written = write(store, {"k": (*attempts, 0, 0, 0, 0)})
    relay, sink = relay_for(store, batch_size=4)
    deliver_everything(store, relay, sink)
    assert_in_order(sink, written)
    second = store.claims[1][1]
    assert [chained for _, chained in second] == [True] * 4, "the second batch was expected to go on from the first"
    assert len(store.renewed) >= 2, "both batches were expected to renew their leases"


def test_hold_lost_marks_the_kept_events_of_a_broken_key_chained_and_only_those() -> None:
    store = MemoryStore()
    for key in ("k", "k", "k", "other", None):
        store.insert("t", {}, key=key)
    events = asyncio.run(store.claim(10, max_attempts=3)).events
    holds = KeyHolds()
    kept = [e for e in events if e.id != 2]
    assert holds.hold_lost([e for e in events if e.id == 2], kept) == [events[0], events[2]]
    assert holds.snapshot() == {"k"}
    assert [e.chained for e in kept] == [True, True, False, False]
    assert not holds.admit(events[0]) and holds.admit(events[3]) and holds.admit(events[4])
