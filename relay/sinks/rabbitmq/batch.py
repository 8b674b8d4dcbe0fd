"""The bookkeeping of one ``publish`` call: its events, whose turn it is, and what became of each.

A key's events go to the channel one at a time: the next only once the broker
confirmed the one before (a confirm window of one per key), so a message that
is nacked, returned or refused is never overtaken by a later one of its key.
Events of other keys and events without a key do not wait for each other. The
events whose turn has come are *ready*; the others of their key wait behind.

A key's events continue across batches the same way: the first event of a key
in a batch that goes on from an earlier batch of the same sink (``chained``)
waits for the confirm of that batch's last event of the key (:meth:`Batch.after`,
on the tails of :mod:`relay.sinks.keyorder`), and is then admitted by the holds
like any other: a failure there has put the key on hold, so it is answered
``HELD`` without being sent.

An event is *unresolved* until it gets an outcome. An outcome is *settled*
when the broker decided it (ack, nack, return, a size rejection) or the event
cannot be encoded; the other outcomes (refused up front, a lost channel, a
timeout, held) say nothing about the broker. An event is a *suspect* while its
channel was closed by the broker in refusal of something sent on it: the sink
sends it again to find out whether it was the cause, and the rest of its key
waits for the verdict. Any other failure *stops* the key: it is held
(:class:`relay.holds.KeyHolds`) at once, and its later events are answered
:data:`relay.events.HELD` without being sent.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Sequence

from relay.events import HELD, Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.sinks.keyorder import Turns


class Batch:
    """One ``publish`` call: its events, whose turn it is, and what became of each."""

    __slots__ = (
        "_changed",
        "_loop",
        "_next",
        "done",
        "events",
        "outcomes",
        "ready",
        "refused",
        "sent",
        "settled_indices",
        "suspects",
        "turns",
        "unresolved",
        "waiting",
    )

    def __init__(self, events: Sequence[Event], loop: asyncio.AbstractEventLoop, holds: KeyHolds | None) -> None:
        self._loop = loop
        self.events = events
        #: The events' place in their keys' order: admitted, held and followed there.
        self.turns = Turns(events, holds)
        self.outcomes: list[Outcome] = [None] * len(events)
        self.unresolved: set[int] = set(range(len(events)))
        #: Handed to the channel, waiting for the broker's confirm.
        self.sent: set[int] = set()
        #: Whose turn has come, in batch order: the first event of each key, every event without one.
        self.ready: list[int] = []
        #: Per event, the index of the next event of its key (-1: none).
        self._next: list[int] = [-1] * len(events)
        #: Refused up front (see :mod:`.limits`): index -> why.
        self.refused: dict[int, str] = {}
        self.settled_indices: set[int] = set()
        self.suspects: set[int] = set()
        self.done: asyncio.Future[None] = loop.create_future()
        self._changed: asyncio.Future[None] | None = None
        #: First events of their key here, waiting for an earlier batch's last event of it (see after()).
        self.waiting: set[int] = set()
        last: dict[str, int] = {}
        for index, event in enumerate(events):
            key = event.key
            if key is None:
                self.ready.append(index)
                continue
            before = last.get(key)
            if before is None:
                self.ready.append(index)
            else:
                self._next[before] = index
            last[key] = index
        if not events:
            self.done.set_result(None)

    def after(self) -> None:
        """Hold back each key's first event here until the key's tail in the batches handed out before
        this one is final (``turns.before``, filled as the sink entered the batch in its key order).

        Then it is ready: the holds admit it if that event was acknowledged (and
        the key not held otherwise), and answer it ``HELD`` if not, since every
        outcome but an acknowledgement holds the key (see :meth:`_follow`).
        """
        waiting = self.turns.before
        if not waiting:
            return
        self.ready = [i for i in self.ready if i not in waiting]
        self.waiting.update(waiting)
        for first, (turns, index) in waiting.items():
            turns.follow(index, functools.partial(self._release, first))

    def _release(self, first: int, _acknowledged: bool) -> None:
        """The event ``first`` waited for is final: ``first``'s turn has come (the holds decide the rest)."""
        self.waiting.discard(first)
        if first in self.unresolved:
            self.ready.append(first)
            self._wake()

    @property
    def settled(self) -> int:
        """How many events have an outcome the broker decided (see the module)."""
        return len(self.settled_indices)

    def take_ready(self) -> list[int]:
        """The events whose turn has come, in order; they are the caller's to send now."""
        ready, self.ready = self.ready, []
        return ready

    async def changed(self) -> None:
        """Return once an event became ready, or none is in flight any more."""
        if self._changed is None or self._changed.done():
            self._changed = self._loop.create_future()
        await self._changed

    async def resolved(self, indices: Iterable[int]) -> None:
        """Return once none of ``indices`` (each sent, or decided) is unresolved."""
        wanted = set(indices)
        while not wanted.isdisjoint(self.unresolved):
            await self.changed()

    def resolve(self, index: int, outcome: Outcome, *, settled: bool) -> None:
        """Set the outcome of event ``index`` unless it has one; acknowledged, its key's next is
        ready, otherwise its key stops."""
        if self._set(index, outcome, settled=settled):
            self._follow(index, acknowledged=outcome is None)

    def unsent(self, indices: Iterable[int], error: str) -> None:
        """``indices``, still unresolved, could not be handed over (the link is gone): they go
        back untried, no attempt spent, and their keys stop."""
        for index in indices:
            self.resolve(index, Failure(error, unavailable=True), settled=False)

    def time_out(self, indices: Iterable[int], error: str) -> None:
        """Failures for ``indices`` still unresolved whose confirm never came: the broker may have them."""
        for index in indices:
            self.resolve(index, Failure(error, timed_out=True), settled=False)

    def abandon(self, error: str) -> None:
        """Every event still unresolved, never sent, is given back untried (``held``: no attempt spent)."""
        for index in sorted(self.unresolved):
            self.resolve(index, Failure(error, held=True), settled=False)

    def suspect(self, indices: Iterable[int], error: str) -> None:
        """``indices`` were in flight (or not yet sent) when the broker closed the channel in refusal.

        Their keys wait: a suspect may be innocent, sent again and confirmed."""
        for index in indices:
            if index in self.unresolved:
                self.suspects.add(index)
                self._set(index, Failure(error), settled=False)

    def suspect_again(self, indices: Iterable[int]) -> None:
        """``indices``, sent again, were lost with the link for another reason: still suspects."""
        self.suspects.update(indices)

    def convict(self, index: int, failure: Failure) -> None:
        """Suspect ``index`` was refused again on its own: it is the cause, and its key stops."""
        self.suspects.discard(index)
        self.outcomes[index] = failure
        self.settled_indices.add(index)
        self._follow(index, acknowledged=False)

    def retry(self, indices: Iterable[int]) -> None:
        """Send the suspects ``indices`` again: unresolved once more, with a fresh ``done``."""
        for index in indices:
            self.suspects.discard(index)
            self.outcomes[index] = None
            self.unresolved.add(index)
        if self.unresolved and self.done.done():
            self.done = self._loop.create_future()

    def give_back(self, error: str) -> None:
        """The suspects not cleared in time go back untried: no attempt is spent on them."""
        for index in sorted(self.suspects):
            self.outcomes[index] = Failure(error, unavailable=True)
            self._follow(index, acknowledged=False)
        self.suspects.clear()

    def _set(self, index: int, outcome: Outcome, *, settled: bool) -> bool:
        if index not in self.unresolved:
            return False
        self.unresolved.discard(index)
        self.sent.discard(index)
        self.outcomes[index] = outcome
        if settled:
            self.settled_indices.add(index)
        if not self.unresolved and not self.done.done():
            self.done.set_result(None)
        if not self.sent:
            self._wake()
        return True

    def _wake(self) -> None:
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def _follow(self, index: int, *, acknowledged: bool) -> None:
        """Event ``index`` is decided: release its key's next event, or stop its key (then tell
        whoever waits for an event of it, in a later batch too)."""
        later = self._next[index]
        if acknowledged:
            if later >= 0 and later in self.unresolved:
                self.ready.append(later)
                self._wake()
            self.turns.settle(index, acknowledged=True)
            return
        self.turns.settle(index, acknowledged=False)  # holds the key before a later batch is woken
        while later >= 0:
            self._set(later, HELD, settled=False)
            self.turns.settle(later, acknowledged=False)
            later = self._next[later]
