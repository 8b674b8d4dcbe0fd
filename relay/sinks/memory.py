"""An in-memory sink for unit tests: records what it is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from relay.errors import SinkUnavailable
from relay.events import HELD, Event, Outcome
from relay.holds import KeyHolds
from relay.sinks.keyorder import Turns


class MemorySink:
    """Acknowledges everything unless told otherwise.

    ``fail`` decides per event (return a ``Failure`` to refuse it);
    ``available = False`` makes every call raise ``SinkUnavailable``.
    """

    name = "memory"
    chains_keys = True

    def __init__(self, fail: Callable[[Event], Outcome] | None = None) -> None:
        self.fail = fail
        self.available = True
        self.delivered: list[Event] = []
        self.attempted: list[Event] = []
        self.closed = False

    async def start(self) -> None:
        """Fail if unavailable."""
        await self.check()

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        """Record ``events``; acknowledge those ``fail`` lets through (and ``holds`` admits)."""
        turns = Turns(events, holds)
        if not self.available:
            turns.hold(range(len(events)))
        await self.check()
        outcomes: list[Outcome] = []
        for index, event in enumerate(events):
            if not turns.admit(index):
                outcomes.append(HELD)
                continue
            self.attempted.append(event)
            outcome = self.fail(event) if self.fail else None
            if outcome is None:
                self.delivered.append(event)
            else:
                turns.hold((index,))
            outcomes.append(outcome)
        return outcomes

    async def check(self) -> None:
        """Raise ``SinkUnavailable`` while ``available`` is False."""
        if not self.available:
            raise SinkUnavailable("memory sink switched off")

    async def close(self) -> None:
        """Mark closed."""
        self.closed = True
