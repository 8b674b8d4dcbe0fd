"""One leadership's events between the reader and the confirm: ready, taken, blocked behind their key, done.

:class:`Reading` keeps, for the log source (:class:`relay.sources.log.source.LogSource`), what the
table keeps in its rows: which events may be taken next. The reader appends events to ``ready`` in
commit order; a take hands them out in that order, skipping the keys that must wait (a key with
events in flight that the batches in hand may not go on from, one waiting for a retry or a broker,
one parked behind a dead letter); a confirm marks each event done in the window, or blocks it behind
its key until due again (a key's later events wait behind it, in read order; other keys go on).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from uuid import UUID

from relay.sources.log.window import Pending, Window


def _read_order(pending: Pending) -> int:
    return pending.seq


@dataclass(slots=True)
class Blocked:
    """A key's events waiting behind its first one given back, due again at ``due``."""

    #: In the order they were read (a batch confirmed late may give one back after later ones waited here).
    events: list[Pending]
    due: float
    #: Behind its own failure (a retry), not a broker outage or timeout: the window lets other keys go on.
    retrying: bool = False


@dataclass(slots=True)
class Taken:
    """What one take handed out: the batch, and the events the take writes to the table instead."""

    batch: list[Pending]
    #: Bad envelopes: dead-lettered with the reason, never published.
    bad: list[tuple[Pending, str]]
    #: Events of parked keys: written into the table behind their key's dead letter.
    parked: list[Pending]


class Reading:
    """One leadership's events in hand: ready, taken (by batch), blocked behind a key, or done."""

    def __init__(self, window: Window) -> None:
        self.window = window
        self.ready: deque[Pending] = deque()
        self.blocked: dict[object, Blocked] = {}
        #: The events of each batch handed out and not confirmed yet, by the batch's token.
        self.taken: dict[UUID, dict[int, Pending]] = {}
        #: How many events of each key are taken and not confirmed yet.
        self.flying: dict[str, int] = {}
        #: Keys the table holds back (a dead letter, or events handed over behind one).
        self.parked: set[str] = set()
        #: Keys parked here since the leader last read them from the table (its reading may predate them).
        self.newly_parked: set[str] = set()
        #: Events of bad envelopes (by id()), and why: dead-lettered without a publish.
        self.bad: dict[int, str] = {}
        #: Ids of acknowledged table events: their rows are deleted before the next confirm.
        self.delivered_rows: list[int] = []
        #: Set by the reader when events came (a commit, a batch's worth); a take's wait ends on it.
        self.more = asyncio.Event()
        #: Set when the window has room again: the reader waits on it while the window is full.
        self.room = asyncio.Event()

    def settled(self) -> bool:
        """Nothing in hand: no event ready, blocked or taken."""
        return not self.ready and not self.blocked and not self.taken

    def next_due(self) -> float:
        """When the first blocked key is due again (a second from now if none is)."""
        return min((b.due for b in self.blocked.values()), default=time.monotonic() + 1.0)

    def release_due(self) -> None:
        """Put the keys due again back in front of ``ready``, unless events of theirs are still taken."""
        if not self.blocked:
            return
        now = time.monotonic()
        flying = self.flying
        # A key with events still taken waits for them: they may come back, to go before the later ones.
        due = [k for k, b in self.blocked.items() if b.due <= now and not (isinstance(k, str) and k in flying)]
        for key in due:
            # Its events go first, in order: nothing of the key was taken while it waited.
            self.ready.extendleft(reversed(self.blocked.pop(key).events))
        if due:
            self._count_held()

    def take(self, token: UUID, limit: int, max_bytes: int, going_on: Callable[[], Collection[str]]) -> Taken:
        """Up to ``limit`` events (stopping at ``max_bytes``) in read order, as the batch ``token``.

        A key with events taken already goes on only if it is in ``going_on()`` (its next events are then
        ``chained``, as are the second and later of a key's run in this batch); otherwise its events wait for
        those to be confirmed, as do those of a blocked key.
        """
        self.release_due()
        batch: list[Pending] = []
        bad: list[tuple[Pending, str]] = []
        parked: list[Pending] = []
        taken: dict[int, Pending] = {}
        size = 0
        fresh: set[str] = set()
        chained: Collection[str] | None = None  # going_on(), asked for once a key in flight comes
        ready, blocked, flying, bad_ones, parked_keys = self.ready, self.blocked, self.flying, self.bad, self.parked
        while ready and len(batch) < limit and size < max_bytes:
            pending = ready.popleft()
            if pending.id in taken:
                # A row whose id is a message's LSN (a message's id): a verdict names events by id, so the
                # second goes in the next batch, not beside the first.
                ready.appendleft(pending)
                break
            key = pending.key
            if bad_ones and id(pending) in bad_ones:
                bad.append((pending, bad_ones.pop(id(pending))))
                continue
            if key is None:
                pending.chained = False
            elif key in blocked:
                bisect.insort(blocked[key].events, pending, key=_read_order)
                continue
            elif key in parked_keys:
                parked.append(pending)
                continue
            else:
                count = flying.get(key, 0)
                if count and key not in fresh:
                    if chained is None:
                        chained = going_on()
                    if key not in chained:  # wait for its events in flight
                        blocked[key] = Blocked([pending], 0.0)
                        continue
                elif not count:
                    fresh.add(key)  # its run in this batch goes on from it
                pending.chained = count > 0
                flying[key] = count + 1
            pending.attempts += 1
            batch.append(pending)
            taken[pending.id] = pending
            size += pending.size
        if batch:
            self.taken[token] = taken
        return Taken(batch, bad, parked)

    def untake(self, token: UUID, ids: Collection[int] | None = None) -> list[Pending]:
        """The events ``ids`` (all by default) of batch ``token``, in read order, no longer taken (those it does
        not hold left out)."""
        taken = self.taken.get(token)
        if taken is None:
            return []
        if ids is None:
            found = list(taken.values())  # each key's in read order
            taken.clear()
        else:
            found = [p for i in ids if (p := taken.pop(i, None)) is not None]
            found.sort(key=_read_order)
        if not taken:
            del self.taken[token]
        self.land(found)
        return found

    def fly(self, pendings: Iterable[Pending]) -> None:
        """Count ``pendings``' keys in flight again, one event each, until :meth:`land`: a settle that awaits
        writes (a dead letter, a parked event) keeps its batch's keys in flight meanwhile, so that a take in
        that await does not start one of them afresh, ahead of an event not yet dead-lettered or blocked."""
        flying = self.flying
        for pending in pendings:
            if (key := pending.key) is not None:
                flying[key] = flying.get(key, 0) + 1

    def land(self, pendings: Iterable[Pending]) -> None:
        """One event fewer in flight for each of ``pendings``' keys."""
        flying = self.flying
        for pending in pendings:
            if (key := pending.key) is not None:
                if flying[key] == 1:
                    del flying[key]
                else:
                    flying[key] -= 1

    def rest(self, token: UUID) -> list[int]:
        """The ids batch ``token`` still holds."""
        return list(self.taken.get(token, ()))

    def done(self, pending: Pending, *, delivered: bool = True) -> None:
        """``pending`` was acknowledged (``delivered``), or dead-lettered or parked in the table: done in the
        window. An acknowledged table event's row is deleted before the next confirm."""
        if delivered and pending.row:
            self.delivered_rows.append(pending.id)
        self.window.done(pending)

    def all_done(self, pendings: list[Pending]) -> None:
        """:meth:`done` for each of ``pendings``, all acknowledged (a batch's): the window's counts move once."""
        self.delivered_rows.extend([p.id for p in pendings if p.row])
        self.window.all_done(pendings)

    def park(self, key: str) -> None:
        """``key`` has a dead letter now: its later events go to the table behind it."""
        self.parked.add(key)
        self.newly_parked.add(key)

    def block(self, pending: Pending, due: float, *, retrying: bool = False) -> None:
        """Keep ``pending`` behind its key's first event given back (a key of its own if keyless) until ``due``."""
        key: object = pending.key if pending.key is not None else pending.seq
        blocked = self.blocked.get(key)
        if blocked is None:
            self.blocked[key] = Blocked([pending], due, retrying)
        else:
            bisect.insort(blocked.events, pending, key=_read_order)
            blocked.due = max(blocked.due, due)
            blocked.retrying |= retrying
        if retrying:
            self._count_held()

    def _count_held(self) -> None:
        """Tell the window how many events wait behind their keys' retries."""
        blocked = self.blocked
        self.window.held = sum(len(b.events) for b in blocked.values() if b.retrying) if blocked else 0

    def has_room(self) -> None:
        """Let the reader go on if the window has room."""
        self._count_held()
        if not self.window.full():
            self.room.set()
