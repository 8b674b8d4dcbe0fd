"""The log source: the second adapter of the source port (:mod:`relay.sources.port`), beside the table claim.

The loop (:mod:`relay.loop`) drives it as it drives the table: a take hands
out the events the slot's reader (:class:`.leader.Leader`, in the background)
has put in its window, in commit order, skipping the keys that must wait
(:class:`.queue.Reading`); the batch room (:mod:`relay.batch`) publishes,
judges and confirms them. A confirm marks the acknowledged events done in the
window (the leader confirms the done prefix to the server, off this path); a
retry waits in memory for its backoff, its key's later events behind it; a
dead letter is written into the outbox table and parks its key (its later
events follow it into the table, where ``dead``, ``requeue`` and ``skip`` find
them). Nothing here is leased: renewing keeps every event, and a batch's ids
are the events' places in the log (LSN order).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from uuid import uuid4

from relay.errors import StoreUnavailable
from relay.events import Event
from relay.sources.log.leader import (
    CONNECT_TIMEOUT_SECONDS,
    STANDBY_POLL_SECONDS,
    Leader,
    SlotState,
)
from relay.sources.log.queue import Reading
from relay.sources.log.slot import TableLink
from relay.sources.log.window import Pending
from relay.store.claims import Built, Claim, Dead, Retry, Settlement, Started

logger = logging.getLogger(__name__)


class LogSource:
    """A logical replication slot as a source: events in commit order, confirmed as the done prefix."""

    def __init__(self, leader: Leader) -> None:
        """``leader``: the slot's reader in the background (its sink takes the events handed over to the
        table: parked, requeued)."""
        self.leader = leader

    @property
    def link(self) -> TableLink:
        """The ordinary connection: the slot's lock, fencing, the writes to the outbox table."""
        return self.leader.link

    @property
    def state(self) -> SlotState:
        """The slot as last seen (lag, ``wal_status``, gone, leading)."""
        return self.leader.state

    async def open(self) -> None:
        """Connect the table link, then lead the slot (or wait to) in the background."""
        if not self.link.connected:
            await self.link.connect(CONNECT_TIMEOUT_SECONDS)
        self.leader.start()

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the database answers now (a standby answers too)."""
        self.leader.raise_crash()
        await self.link.check()

    async def close(self) -> None:
        """Confirm what is done, stop reading, disconnect."""
        await self.leader.close()

    async def take(self, limit: int, *, max_bytes: int, chain: Sequence[Claim] = ()) -> Started:
        """Up to ``limit`` events read and not taken yet, in commit order; a key of ``chain`` goes on, one
        with events in flight otherwise waits. Bad envelopes and events of parked keys go to the table."""
        self.leader.raise_crash()
        token = uuid4()
        reading = self.leader.reading
        if reading is None:  # a standby, or between leaderships
            return Built(Claim(token, []))

        def going_on() -> set[str]:
            return {e.key for claim in chain for e in claim.events if e.key is not None}

        taken = reading.take(token, limit, max_bytes, going_on)
        try:
            for pending, reason in taken.bad:
                await self._dead(reading, pending, reason)
            for pending in taken.parked:
                await self._park(reading, pending)
        except StoreUnavailable as exc:
            reading.untake(token)  # never handed to the sink: the next leadership need not wait for it
            self.leader.broken(exc)
            raise
        events: list[Event] = list(taken.batch)  # the events themselves: no object made per event
        return Built(Claim(token, events, buried=len(taken.bad)))

    async def confirm(
        self,
        batch: Claim,
        lease_ends: float,
        *,
        sent: Sequence[int] = (),
        retry: Sequence[Retry] = (),
        dead: Sequence[Dead] = (),
        release: Mapping[float, Sequence[int]] | None = None,
    ) -> Settlement | None:
        """Mark ``sent`` done, keep ``retry`` and ``release`` (``{delay_seconds: ids}``) behind their keys
        until due, dead-letter ``dead`` into the table (parking their keys). None if the batch belongs to a
        leadership that ended (its events are read again) or a write failed (this leadership ends)."""
        found = self.leader.reading_of(batch.token)
        if found is None:
            return None
        reading, current = found
        # Anything the verdict left out goes back at once: it must not hold its key forever.
        pendings = reading.untake(batch.token)
        if not current:
            return None
        settlement = Settlement(sent=len(sent), retried=len(retry), dead=len(dead))
        if len(sent) == len(pendings) and not (retry or dead or release):  # all acknowledged: the usual case
            reading.all_done(pendings)
            reading.has_room()
            return settlement
        retried = {r.id: r.delay_seconds for r in retry}
        died = {d.id: d.error for d in dead}
        delays = {i: delay for delay, ids in (release or {}).items() for i in ids}
        acked = set(sent)
        now = time.monotonic()
        reading.fly(pendings)
        try:
            for pending in pendings:
                event_id = pending.id
                if event_id in acked:
                    reading.done(pending)
                elif event_id in died:
                    await self._dead(reading, pending, died[event_id])
                elif event_id in retried:
                    await self._back(reading, pending, now + retried[event_id], retrying=True)
                elif event_id in delays:
                    pending.attempts -= 1  # not tried, or not answered: no attempt spent
                    await self._back(reading, pending, now + delays[event_id])
                else:
                    pending.attempts -= 1
                    await self._back(reading, pending, now)
        except StoreUnavailable as exc:
            logger.warning("could not write a dead letter, reading again: %s", exc, extra={"action": "settle_retry"})
            self.leader.broken(exc)
            return None
        finally:
            reading.land(pendings)
            reading.has_room()
        return settlement

    async def give_back(self, batch: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Keep ``ids`` of ``batch`` behind their keys, unpublished and no attempt spent, for ``delay_seconds``."""
        found = self.leader.reading_of(batch.token)
        if found is None:
            return
        reading, current = found
        pendings = reading.untake(batch.token, ids)
        if not current:
            return
        due = time.monotonic() + delay_seconds
        reading.fly(pendings)
        try:
            for pending in pendings:
                pending.attempts -= 1
                await self._back(reading, pending, due)
        except StoreUnavailable as exc:
            self.leader.broken(exc)
        finally:
            reading.land(pendings)
            reading.has_room()

    async def renew(self, batch: Claim) -> set[int]:
        """Nothing is leased: the ids the batch still holds (none once its leadership ended)."""
        found = self.leader.reading_of(batch.token)
        return set(found[0].rest(batch.token)) if found is not None and found[1] else set()

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for events to take: read ones, or a key due again; True if some came."""
        self.leader.raise_crash()
        reading = self.leader.reading
        if reading is None:
            try:
                async with asyncio.timeout(min(timeout, STANDBY_POLL_SECONDS)):
                    await self.leader.leading.wait()
            except TimeoutError:
                return False
            return True
        # Only news wakes a take: a commit, or a batch's worth read (the reader sets ``more``). Events of a
        # transaction still being read wait for either, so that batches come full, not one frame's worth.
        more = reading.more
        if not more.is_set():
            if reading.blocked:
                timeout = min(timeout, max(0.01, reading.next_due() - time.monotonic()))
            try:
                async with asyncio.timeout(timeout):
                    await more.wait()
            except TimeoutError:
                return bool(reading.blocked)
        more.clear()
        return True

    async def _back(self, reading: Reading, pending: Pending, due: float, *, retrying: bool = False) -> None:
        """``pending`` back behind its key until ``due``; into the table if its key was parked meanwhile."""
        key = pending.key
        if key is not None and key in reading.parked:
            await self._park(reading, pending)
        else:
            reading.block(pending, due, retrying=retrying)

    async def _dead(self, reading: Reading, pending: Pending, reason: str) -> None:
        await self.link.write(pending, row=pending.row, state="failed", reason=reason, attempts=pending.attempts)
        if pending.key is not None:
            reading.park(pending.key)
        logger.warning("dead-lettered event %d into the table; key parked", pending.id, extra={"action": "dead_letter"})
        reading.done(pending, delivered=False)

    async def _park(self, reading: Reading, pending: Pending) -> None:
        reason = f"parked: an earlier event of key {pending.key!r} is dead-lettered"
        await self.link.write(pending, row=pending.row, state="pending", reason=reason, attempts=0)
        if pending.key is not None:
            # The table holds it now, whatever a sweep's read of the parked keys saw while this write waited.
            reading.park(pending.key)
        reading.done(pending, delivered=False)
