"""The sink port: where claimed events are published."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from relay.events import Event, Outcome


class Sink(Protocol):
    """A broker adapter.

    ``publish`` sends a whole batch without waiting between messages, then waits
    for every acknowledgement (or the publish timeout) and returns one outcome
    per event, in the order given. Events of one key appear in the batch in
    write order and must reach the broker in that order.

    ``publish`` raises :class:`relay.errors.SinkUnavailable` when the broker
    cannot be reached at all and no event of the batch was acknowledged; the
    relay then releases the batch without counting an attempt and backs off.
    A sink over several brokers (:class:`relay.sinks.routing.RoutingSink`)
    instead answers ``Failure(unavailable=True)`` for the events of a broker
    that is down while others are up: those alone go back, no attempt spent.
    """

    name: str

    async def start(self) -> None:
        """Connect; raise ``SinkUnavailable`` if the broker cannot be reached."""

    async def publish(self, events: Sequence[Event]) -> list[Outcome]:
        """Publish ``events`` and return one outcome per event."""

    async def check(self) -> None:
        """Raise ``SinkUnavailable`` unless the broker is reachable now."""

    async def close(self) -> None:
        """Flush what can be flushed and disconnect. Safe to call twice."""


def scrubbed(outcomes: list[Outcome], scrub: Callable[[str], str]) -> list[Outcome]:
    """``outcomes`` with ``scrub`` applied to each failure's text: it becomes ``last_error``,
    which ``outbox-relay dead`` shows, and a driver's message may echo a secret."""
    return [None if outcome is None else replace(outcome, error=scrub(outcome.error)) for outcome in outcomes]
