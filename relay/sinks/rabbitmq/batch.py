"""The bookkeeping of one ``publish`` call: its events and what became of each.

An event is *unresolved* while it waits for the broker, then gets an outcome.
An outcome is *settled* when the broker decided it (ack, nack, return, a size
rejection) or the event cannot be encoded; the other outcomes (a lost channel,
a timeout) say nothing about the event. An event is a *suspect* while its
channel was closed by the broker in refusal of something sent on it: the sink
sends it again to find out whether it was the cause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from relay.events import Event, Failure, Outcome


class Batch:
    """One ``publish`` call: its events and what became of each."""

    __slots__ = ("_loop", "done", "events", "outcomes", "settled_indices", "suspects", "unresolved")

    def __init__(self, events: Sequence[Event], loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.events = events
        self.outcomes: list[Outcome] = [None] * len(events)
        self.unresolved: set[int] = set()
        self.settled_indices: set[int] = set()
        self.suspects: set[int] = set()
        self.done: asyncio.Future[None] = loop.create_future()

    @property
    def settled(self) -> int:
        """How many events have an outcome the broker decided (see the module)."""
        return len(self.settled_indices)

    def resolve(self, index: int, outcome: Outcome, *, settled: bool) -> None:
        """Set the outcome of event ``index`` unless it has one."""
        if index not in self.unresolved:
            return
        self.unresolved.discard(index)
        self.outcomes[index] = outcome
        if settled:
            self.settled_indices.add(index)
        if not self.unresolved and not self.done.done():
            self.done.set_result(None)

    def fail(self, indices: Iterable[int], error: str) -> None:
        """Transient failures for ``indices`` that are still unresolved."""
        for index in indices:
            self.resolve(index, Failure(error), settled=False)

    def time_out(self, indices: Iterable[int], error: str) -> None:
        """Failures for ``indices`` still unresolved whose confirm never came: the broker may have them."""
        for index in indices:
            self.resolve(index, Failure(error, timed_out=True), settled=False)

    def suspect(self, indices: Iterable[int], error: str) -> None:
        """``indices`` were in flight (or not yet sent) when the broker closed the channel in refusal."""
        for index in indices:
            if index in self.unresolved:
                self.suspects.add(index)
                self.resolve(index, Failure(error), settled=False)

    def suspect_again(self, indices: Iterable[int]) -> None:
        """``indices``, sent again, were lost with the link for another reason: still suspects."""
        self.suspects.update(indices)

    def convict(self, index: int, failure: Failure) -> None:
        """Suspect ``index`` was refused again on its own: it is the cause."""
        self.suspects.discard(index)
        self.outcomes[index] = failure
        self.settled_indices.add(index)

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
        self.suspects.clear()
