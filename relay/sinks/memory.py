"""An in-memory sink for unit tests: records what it is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from relay.errors import SinkUnavailable
from relay.events import Event, Outcome


class MemorySink:
    """Acknowledges everything unless told otherwise.

    ``fail`` decides per event (return a ``Failure`` to refuse it);
    ``available = False`` makes every call raise ``SinkUnavailable``.
    """

    name = "memory"

    def __init__(self, fail: Callable[[Event], Outcome] | None = None) -> None:
        self.fail = fail
        self.available = True
        self.delivered: list[Event] = []
        self.attempted: list[Event] = []
        self.closed = False

    async def start(self) -> None:
        """Fail if unavailable."""
        await self.check()

    async def publish(self, events: Sequence[Event]) -> list[Outcome]:
        """Record ``events``; acknowledge those ``fail`` lets through."""
        await self.check()
        outcomes: list[Outcome] = []
        for event in events:
            self.attempted.append(event)
            outcome = self.fail(event) if self.fail else None
            if outcome is None:
                self.delivered.append(event)
            outcomes.append(outcome)
        return outcomes

    async def check(self) -> None:
        """Raise ``SinkUnavailable`` while ``available`` is False."""
        if not self.available:
            raise SinkUnavailable("memory sink switched off")

    async def close(self) -> None:
        """Mark closed."""
        self.closed = True
