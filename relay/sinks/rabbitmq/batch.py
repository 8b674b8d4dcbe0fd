"""The bookkeeping of one ``publish`` call: its events and what became of each."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from relay.events import Event, Failure, Outcome


class Batch:
    """One ``publish`` call: its events and what became of each."""

    __slots__ = ("done", "events", "outcomes", "settled", "unresolved")

    def __init__(self, events: Sequence[Event], loop: asyncio.AbstractEventLoop) -> None:
        self.events = events
        self.outcomes: list[Outcome] = [None] * len(events)
        self.unresolved: set[int] = set()
        #: Outcomes that do not depend on the connection: the broker's answers
        #: (ack, nack, return, size rejection) and events that cannot be encoded.
        self.settled = 0
        self.done: asyncio.Future[None] = loop.create_future()

    def resolve(self, index: int, outcome: Outcome, *, settled: bool) -> None:
        """Set the outcome of event ``index`` unless it has one."""
        if index not in self.unresolved:
            return
        self.unresolved.discard(index)
        self.outcomes[index] = outcome
        self.settled += settled
        if not self.unresolved and not self.done.done():
            self.done.set_result(None)

    def fail(self, indices: Sequence[int], error: str) -> None:
        """Transient failures for ``indices`` that are still unresolved."""
        for index in indices:
            self.resolve(index, Failure(error), settled=False)
