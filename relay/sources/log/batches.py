"""The log relay's events between the reader and the confirm: taken in batches, published, judged, settled.

:class:`Batches` owns each read event's life once the reader hands it over:
``ready`` (in read order), then in a batch with the sink, then done (its
window entry marked, a table row's id kept for the bulk delete), or
``blocked`` behind its key's first failure until due again, or written into
the outbox table (a dead letter, or parked behind one). The outcomes are
handed to the sink, judged and charged as the table relay's are, in the batch
room (:func:`relay.batch.life.hand_to_sink`, :class:`relay.batch.costs.Costs`);
a key's later events wait behind its first failed one, other keys go on. The relay
(:mod:`relay.sources.log.relay`) drives it and confirms what the window says
is done.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections import deque
from dataclasses import dataclass

from relay.backoff import Backoff, OutageBackoff
from relay.batch.costs import Costs
from relay.batch.life import Published, hand_to_sink
from relay.batching import BatchLimits
from relay.config import RelaySettings
from relay.errors import SinkTimeout, SinkUnavailable
from relay.events import Event
from relay.holds import KeyHolds
from relay.metrics import Metrics
from relay.sinks.base import Sink
from relay.sources.log.handover import deliver_handed_over
from relay.sources.log.slot import TableLink
from relay.sources.log.window import Pending, Window

logger = logging.getLogger(__name__)

Sent = Published


def _read_order(pending: Pending) -> int:
    return pending.seq


@dataclass(slots=True)
class _Blocked:
    """A key's events waiting behind its first failed one, due again at ``due``."""

    #: In the order they were read (a batch still in flight may hand one back after later ones waited here).
    events: list[Pending]
    due: float
    #: Behind its own failure (a retry), not a broker outage or timeout: the window lets other keys go on.
    retrying: bool = False


class Batches:
    """One leadership's events in hand: ready, in flight, blocked behind a failure, or handed to the table."""

    def __init__(
        self,
        window: Window,
        sink: Sink,
        store: TableLink,
        settings: RelaySettings,
        metrics: Metrics,
        *,
        backoff: Backoff,
        timeouts: OutageBackoff,
        sink_outage: OutageBackoff,
        depth: int,
    ) -> None:
        self.window = window
        self.sink = sink
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.depth = depth
        self._backoff = backoff
        # What each answer costs: as the table relay's, over this relay's timeouts and its own batch limits.
        limits = BatchLimits(settings.batch_size, settings.batch_bytes)
        self._costs = Costs(settings, metrics, limits, timeouts=timeouts, backoff=backoff)
        self._sink_outage = sink_outage
        self.ready: deque[Pending] = deque()
        self.blocked: dict[object, _Blocked] = {}
        # Batches handed to the sink, oldest first, and how many events of each key they hold.
        self.in_flight: deque[tuple[list[Pending], asyncio.Task[Sent]]] = deque()
        self._flying_keys: dict[str, int] = {}
        self._holds = KeyHolds()
        self.sink_down = False
        self.parked: set[str] = set()
        self.delivered_rows: list[int] = []
        # Events of bad envelopes (by id()), and why: dead-lettered without a publish.
        self.bad: dict[int, str] = {}

    def settled(self) -> bool:
        """Nothing in hand: no event ready, blocked or with the sink."""
        return not self.ready and not self.blocked and not self.in_flight

    def count_held(self) -> None:
        """Tell the window how many events wait behind their keys' retries."""
        self.window.held = sum(len(b.events) for b in self.blocked.values() if b.retrying) if self.blocked else 0

    def next_due(self) -> float:
        """When the first blocked key is due again (a second from now if none is)."""
        return min((b.due for b in self.blocked.values()), default=time.monotonic() + 1.0)

    def release_due(self) -> None:
        """Put the keys due again back in front of ``ready``, unless events of theirs are still in flight."""
        now = time.monotonic()
        flying = self._flying_keys
        # A key with events still in flight waits for them: they may come back, to go before the later ones.
        for key in [k for k, b in self.blocked.items() if b.due <= now and not (isinstance(k, str) and k in flying)]:
            # Its events go first, in order: nothing of the key was taken while it waited.
            self.ready.extendleft(reversed(self.blocked.pop(key).events))

    async def send_more(self) -> None:
        """Hand batches to the sink while fewer than ``depth`` are in flight and the broker is not down."""
        while len(self.in_flight) < self.depth and not self.sink_down:
            batch = self._take_batch()
            if not batch:
                break
            to_sink = await self._prepare(batch)
            if to_sink:
                sending = asyncio.create_task(self._send([p.event for p in to_sink]))
                self.in_flight.append((to_sink, sending))
                await asyncio.sleep(0)  # handed to the sink before the next batch

    def _take_batch(self) -> list[Pending]:
        batch: list[Pending] = []
        size = 0
        ready = self.ready
        limit, max_bytes = self._costs.limits.count, self._costs.limits.max_bytes
        while ready and len(batch) < limit and size < max_bytes:
            pending = ready.popleft()
            key = pending.event.key
            if key is not None and key in self.blocked:
                bisect.insort(self.blocked[key].events, pending, key=_read_order)
                continue
            batch.append(pending)
            size += pending.size
        return batch

    async def _prepare(self, batch: list[Pending]) -> list[Pending]:
        """What of ``batch`` goes to the sink: bad envelopes are dead-lettered and events of parked keys
        written to the table here. Each event of a key with an earlier one in flight is chained."""
        to_sink: list[Pending] = []
        for pending in batch:
            event = pending.event
            if id(event) in self.bad:
                await self._dead(pending, self.bad.pop(id(event)))
            elif event.key is not None and event.key in self.parked:
                await self._park(pending)
            else:
                to_sink.append(pending)
        flying = self._flying_keys
        for pending in to_sink:
            event = pending.event
            event.attempts += 1
            key = event.key
            if key is None:
                event.chained = False
            else:
                count = flying.get(key, 0)
                event.chained = count > 0
                flying[key] = count + 1
        return to_sink

    async def _send(self, events: list[Event]) -> Sent:
        # Not traced yet: the log relay's batches carry no producer spans to link.
        return await hand_to_sink(self.sink, events, self._holds, traced=False)

    async def settle(self, to_sink: list[Pending], result: Sent) -> None:
        """Judge a published batch's outcomes, in the order the batches were handed to the sink."""
        now = time.monotonic()
        events = [p.event for p in to_sink]
        flying = self._flying_keys
        for event in events:
            if (key := event.key) is not None:
                if flying[key] == 1:
                    del flying[key]
                else:
                    flying[key] -= 1
        if isinstance(result, SinkTimeout | SinkUnavailable):
            for event in events:
                event.attempts -= 1
            if isinstance(result, SinkTimeout):
                (delay,) = self._costs.whole_batch_timed_out(events, result).held
                self._block(to_sink, now + delay)
            else:
                self._costs.broker_unavailable(events, result)
                self._block(to_sink, 0.0)
                self.sink_down = True
            return
        outcomes = result
        self._sink_outage.reset()
        # Timed-out events come back held, after the timeouts' backoff.
        verdict = self._costs.verdict(events, outcomes)
        dead = {d.id: d.error for d in verdict.dead}
        retry = {r.id: r.delay_seconds for r in verdict.retry}
        held = {i: delay for delay, ids in verdict.held.items() for i in ids}
        for pending, outcome in zip(to_sink, outcomes, strict=True):
            event = pending.event
            if outcome is None:
                self._done(pending)
            elif event.key is not None and event.key in self.parked:
                event.attempts -= 1
                await self._park(pending)
            elif event.id in dead:
                await self._dead(pending, dead[event.id])
            else:
                if event.id not in retry:
                    event.attempts -= 1  # held back, timed out: no attempt spent
                delay = retry.get(event.id, held.get(event.id, 0.0))
                self._block([pending], now + delay, retrying=event.id in retry)

    async def sweep(self, stop: asyncio.Event) -> None:
        """Deliver what was handed over to the table and may go now; park exactly the keys it still holds."""
        if not stop.is_set():
            await deliver_handed_over(self.store, self.sink, self.settings, self._backoff, self.metrics)
        self.parked = await self.store.parked_keys()
        self.metrics.parked_keys.set(len(self.parked))

    def _block(self, pendings: list[Pending], due: float, *, retrying: bool = False) -> None:
        """Keep ``pendings`` behind their keys' first failure (a key of its own each if keyless) until ``due``."""
        for pending in pendings:
            key: object = pending.event.key if pending.event.key is not None else pending
            blocked = self.blocked.get(key)
            if blocked is None:
                self.blocked[key] = _Blocked([pending], due, retrying)
            else:
                bisect.insort(blocked.events, pending, key=_read_order)
                blocked.retrying |= retrying

    def _done(self, pending: Pending) -> None:
        if pending.row:
            self.delivered_rows.append(pending.event.id)
        self.window.done(pending)

    async def _dead(self, pending: Pending, reason: str) -> None:
        event = pending.event
        await self.store.write(event, row=pending.row, state="failed", reason=reason, attempts=event.attempts)
        if event.key is not None:
            self.parked.add(event.key)
        logger.warning("dead-lettered event %d into the table; key parked", event.id, extra={"action": "dead_letter"})
        self.window.done(pending)

    async def _park(self, pending: Pending) -> None:
        event = pending.event
        reason = f"parked: an earlier event of key {event.key!r} is dead-lettered"
        await self.store.write(event, row=pending.row, state="pending", reason=reason, attempts=0)
        self.window.done(pending)
