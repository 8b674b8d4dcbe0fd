"""A batch's life, in one pass: renewed if stale, handed to the sink, judged, confirmed or given back.

:class:`Deliveries` takes each claimed batch (:meth:`Deliveries.take`) and
lives it (:meth:`Deliveries.deliver`); it owns the two rules that span
batches: the keys on hold (:class:`relay.holds.KeyHolds`) and the turn order
between batches. What each answer of the sink costs is decided by
:class:`relay.batch.costs.Costs`; the source (:mod:`relay.sources.port`)
confirms and takes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from uuid import UUID

from relay.batch.costs import Costs, Verdict
from relay.config import RelaySettings
from relay.errors import SinkTimeout, SinkUnavailable, StoreUnavailable
from relay.events import Event, Outcome
from relay.holds import KeyHolds, mark_chained
from relay.metrics import Metrics
from relay.sinks.base import Sink
from relay.sources.port import Claim, Source
from relay.tracing import batch_span

logger = logging.getLogger(__name__)

#: What a publish gave: an outcome for each event, or what the sink raised for the whole batch.
Published = list[Outcome] | SinkTimeout | SinkUnavailable

#: How many batches done with whose keys count as recent: a key that comes back within them recurs.
RECENT_BATCHES = 2


class State(enum.Enum):
    """Where a batch is in its life."""

    #: Leased, waiting for the batch before it to have its turn.
    CLAIMED = "claimed"
    #: Handed to the sink: the next batch may go.
    HANDED = "handed to the sink"
    #: Its outcomes sorted and charged.
    JUDGED = "judged"
    #: Its outcomes recorded by the source (or its lease ended trying).
    SETTLED = "settled"
    #: Given back unpublished, its keys held: its lease was nearly over and could not be renewed.
    GIVEN_BACK = "given back"


@dataclass(eq=False, slots=True)
class Batch:
    """One claimed batch on its way: its claim (renewed, less what it lost), when its lease started,
    and the turn it waits for (``before``) and gives (``turn``)."""

    claim: Claim
    claimed_at: float
    before: asyncio.Event | None
    #: The room's holds as this batch sees them, from its place in claim order (relay/holds.py).
    holds: KeyHolds
    turn: asyncio.Event = field(default_factory=asyncio.Event)
    state: State = State.CLAIMED
    #: The claim as it was taken, before any renewal.
    taken: Claim = field(init=False)

    def __post_init__(self) -> None:
        self.taken = self.claim


async def hand_to_sink(sink: Sink, events: Sequence[Event], holds: KeyHolds, *, traced: bool = True) -> Published:
    """Publish ``events`` with ``holds``: each event's outcome, or the ``SinkTimeout`` or ``SinkUnavailable``
    raised for the whole batch. Either way, every key not acknowledged is held before this returns: the
    sink held them already, and one that forgot must not break their order. With ``traced``, in a span."""
    try:
        with batch_span(events, system=sink.name) if traced else contextlib.nullcontext():
            outcomes = await sink.publish(events, holds)
    except (SinkTimeout, SinkUnavailable) as exc:
        holds.hold(events)
        return exc
    holds.hold([e for e, outcome in zip(events, outcomes, strict=False) if outcome is not None])
    return outcomes


class Deliveries:
    """The table relay's batches in hand: their turns, the keys on hold, and each one's life."""

    def __init__(
        self,
        source: Source,
        sink: Sink,
        settings: RelaySettings,
        metrics: Metrics,
        costs: Costs,
        *,
        publish_grace_seconds: float = 0.0,
        recurring: bool = True,
    ) -> None:
        """``recurring``: whether claims are told which keys of the batches in hand recur (the table's claim
        goes on with them, :func:`relay.store.claims.chained_keys`; the log's take goes on with every key in
        hand, and needs no such sets built per take and per batch)."""
        self.source = source
        self.recurring = recurring
        self.sink = sink
        self.settings = settings
        self.metrics = metrics
        self.costs = costs
        #: A batch whose lease started longer ago than this renews it (or goes back) before publishing.
        self.latest_publish_start = settings.latest_publish_start_seconds(publish_grace_seconds)
        #: Keys whose chain of events in flight broke (relay/holds.py): the one owner. Each batch sees them
        #: from its place in claim order (``batch.holds``).
        self.holds = KeyHolds()
        #: How many batches were taken: the next one's number.
        self._taken = 0
        #: The batches in hand and when their leases started: on a sink that keeps a key's order
        #: across batches, a claim may go on with the keys they hold.
        self.flying: dict[UUID, tuple[Claim, float]] = {}
        #: The keys of the last batches done with: a key of a batch in hand that was in one of them too
        #: is a busy one, and a claim goes on with it even with one event in hand (see :meth:`chain`).
        self.recent_keys: deque[frozenset[str]] = deque(maxlen=RECENT_BATCHES)
        # Set once the batch taken last was handed to the sink or given back: the next batch
        # may go on with its keys, so it waits for that before publishing (see ``deliver``).
        self._last_turn: asyncio.Event | None = None

    def chain(self, now: float, *, more: Sequence[Claim] = ()) -> list[Claim]:
        """The batches in hand a claim may go on from: those that may still be published, and ``more``,
        without the events of keys on hold (their next runs would only come back held). None on a sink
        that does not keep a key's order across batches."""
        if not self.sink.chains_keys:
            return []
        chain = [claim for claim, at in self.flying.values() if now - at < self.latest_publish_start]
        chain.extend(more)
        held = self.holds.snapshot()
        if held:
            chain = [replace(claim, events=[e for e in claim.events if e.key not in held]) for claim in chain]
        if self.recurring and self.recent_keys:
            recent = frozenset().union(*self.recent_keys)
            chain = [
                replace(claim, recurring=frozenset(e.key for e in claim.events if e.key in recent)) for claim in chain
            ]
        return chain

    def take(self, claim: Claim, claimed_at: float) -> Batch:
        """``claim``, just built, as a batch in hand: it goes after the batch taken before it."""
        mark_chained(claim.events, [other.events for other, _ in self.flying.values()])
        self.flying[claim.token] = (claim, claimed_at)
        self._taken += 1
        batch = Batch(claim, claimed_at, self._last_turn, self.holds.of(self._taken))
        self._last_turn = batch.turn
        return batch

    def hold(self, events: Sequence[Event]) -> None:
        """Put the keys of ``events`` on hold: leased here, they will not be published (their events
        could not be built, or a claim started ahead goes back), and a batch may go on from them. Not taken
        as a batch, they come after every batch taken."""
        self.holds.of(self._taken + 1).hold(events)

    async def give_back(self, claim: Claim) -> None:
        """A claim never taken as a batch (started ahead, not wanted) goes back unpublished, its keys held."""
        self.hold(claim.events)
        await self.source.give_back(claim, [e.id for e in claim.events])

    async def deliver(self, batch: Batch) -> None:
        """Live ``batch`` once the batch taken before it has had its turn.

        On a sink that keeps a key's order across batches, this batch may hold the next events of
        the keys of the one before it, and the sink keeps their order only if it is handed that
        batch first. Batches usually start in the order they were claimed, but one that must renew
        its lease first (a slow claim, a stalled process) waits for the database meanwhile: the
        batch after it must not overtake it.

        A batch that ends in an error once its turn is given (a bug in the sink, the judge or the
        source) settles nothing: its events stay leased, so its keys are held before the error stops
        the relay, and the batches in hand it drains on the way out send none of their later events.
        """
        try:
            if batch.before is not None and self.sink.chains_keys:
                await batch.before.wait()
            if not await self._within_lease(batch):
                return
            verdict = await self._hand_to_sink(batch)
            batch.state = State.JUDGED
            await self._confirm(batch, verdict)
        except BaseException:
            batch.holds.hold(batch.taken.events)
            raise
        finally:
            self.end(batch)

    def end(self, batch: Batch) -> None:
        """``batch`` is done with: one that ended before it reached the sink (an error, a cancellation)
        holds its keys first, so that the next batch does not send their later events. Safe to call twice."""
        if not batch.turn.is_set():
            batch.holds.hold(batch.taken.events)
            batch.turn.set()
        if self.flying.pop(batch.taken.token, None) is not None and self.sink.chains_keys and self.recurring:
            self.recent_keys.append(frozenset(e.key for e in batch.taken.events if e.key is not None))

    async def _within_lease(self, batch: Batch) -> bool:
        """Whether ``batch`` may be published on its lease: one that waited (a slow claim, a stalled
        process) until its lease could end before the publish and the settle are done renews the lease
        of what it still holds, or goes back. Publishing on the old lease could race the relay that
        takes it over."""
        if time.monotonic() - batch.claimed_at > self.latest_publish_start:
            renewing = time.monotonic()
            if (fresh := await self._renewed(batch)) is not None:
                batch.claim, batch.claimed_at = fresh, renewing
                self.flying[fresh.token] = (fresh, renewing)
        if time.monotonic() - batch.claimed_at <= self.latest_publish_start:
            return True
        claim = batch.claim
        logger.warning(
            "lease nearly over before publishing, releasing %d events",
            len(claim.events),
            extra={"action": "release_stale", "batch_size": len(claim.events)},
        )
        batch.holds.hold(claim.events)
        batch.turn.set()
        batch.state = State.GIVEN_BACK
        lease_ends = batch.claimed_at + self.settings.lease_seconds
        await self.source.confirm(claim, lease_ends, release={0.0: [e.id for e in claim.events]})
        return False

    async def _renewed(self, batch: Batch) -> Claim | None:
        """``batch``'s claim with its lease started again, less the events it no longer holds; None if it holds
        none.

        A batch whose claim was slow to come back (a payload of many megabytes) or
        that waited in a stalled process has too little lease left to publish and
        settle. Giving it back unpublished would not help: the next claim would
        take as long, the event would never be tried and its key never move. So it
        keeps what it still holds, from now, and goes on.

        It holds only events whose lease has not ended (:meth:`Source.renew`): past
        it, another relay's reaper may have dead-lettered an event of the batch in
        the middle of its key's run, and the rest of the run is no longer next of
        its key. A key that lost an event sends nothing from this batch: the key
        is held and its kept events are marked chained, so the sink answers them
        held and they go back untried (:meth:`KeyHolds.hold_lost`), and so does
        any batch that went on with the key meanwhile.
        """
        claim = batch.claim
        try:
            kept = await self.source.renew(claim)
        except StoreUnavailable as exc:
            logger.warning("could not renew a stale batch's lease: %s", exc, extra={"action": "renew_failed"})
            return None
        if not kept:
            return None
        events = [e for e in claim.events if e.id in kept]
        held = batch.holds.hold_lost([e for e in claim.events if e.id not in kept], events)
        logger.warning(
            "lease nearly over before publishing: renewed it for %d events (%d lost meanwhile, %d held behind them)",
            len(events),
            len(claim.events) - len(events),
            len(held),
            extra={"action": "renew_stale", "batch_size": len(events)},
        )
        return Claim(claim.token, events, claim.taken_over & kept)

    async def _hand_to_sink(self, batch: Batch) -> Verdict:
        """Publish the batch (the next batch goes once it is handed over: it runs up to its first wait
        first), and judge what the sink answered, or raised."""
        events = batch.claim.events
        started = time.monotonic()
        batch.state = State.HANDED
        batch.turn.set()
        published = await hand_to_sink(self.sink, events, batch.holds)
        if isinstance(published, SinkTimeout):
            return self.costs.whole_batch_timed_out(events, published)
        if isinstance(published, SinkUnavailable):
            return self.costs.broker_unavailable(events, published)
        self.costs.check_publish_time(time.monotonic() - started)
        return self.judge(events, published)

    def judge(self, events: Sequence[Event], outcomes: Sequence[Outcome]) -> Verdict:
        """The sink's answers for ``events``, sorted and charged (:meth:`Costs.verdict`)."""
        return self.costs.verdict(events, outcomes)

    async def _confirm(self, batch: Batch, verdict: Verdict) -> None:
        """Record the verdict within the batch's lease: sent, retried, dead, and given back (by delay)."""
        claim = batch.claim
        settlement = await self.source.confirm(
            claim,
            batch.claimed_at + self.settings.lease_seconds,
            sent=verdict.sent,
            retry=verdict.retry,
            dead=verdict.dead,
            release=verdict.held,
        )
        batch.state = State.SETTLED
        self.costs.retried = self.costs.retried or bool(verdict.retry)
        if settlement is not None and settlement.lost:
            self.metrics.lost_leases.inc(settlement.lost)
            logger.warning(
                "%d events of a batch were taken over by another relay before settling",
                settlement.lost,
                extra={"action": "lease_lost", "batch_size": len(claim.events)},
            )
