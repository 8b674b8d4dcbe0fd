"""The sink port: where claimed events are published, and what a sink's answers mean.

``Sink.publish`` answers each event with one :data:`relay.events.Outcome`.
``None`` is the only acknowledgement; every other answer is a
:class:`relay.events.Failure` of one kind, or the whole call raises. What each
costs (relay/batch/costs.py sorts and charges them, relay/batch/life.py settles them):

==========================  ======================  =======  ========================  ============  ==================
answer                      the event               attempt  due again                 batch shrinks metrics
==========================  ======================  =======  ========================  ============  ==================
``None`` (acknowledged)     sent                    --       --                        grows back    published, latency
``HELD`` (``held``)         not tried: its key      no       at once, after the key's  no            none
                            is on hold                       earlier event
``unavailable``             not tried: its route's  no       ``retry_after_seconds``   no            none
                            broker is down
``timed_out``               maybe stored            no       timeout backoff           halves        failed attempts
``permanent`` (refused)     never deliverable       yes      dead-lettered now         no            failed, dead
failed (none of these)      refused this time       yes      backoff by attempts;      no            failed attempts
                                                             dead at --max-attempts
raises ``SinkTimeout``      all maybe stored        no       timeout backoff           halves        failed attempts
raises ``SinkUnavailable``  none acknowledged       no       at once; claims wait for  no            none
                                                             ``check()`` to pass
==========================  ======================  =======  ========================  ============  ==================

A sink raises rather than returns only for the whole batch, when no event
of it was acknowledged: ``SinkUnavailable`` when the broker could not be
reached (connection refused or lost before any confirm), ``SinkTimeout`` when
it was reached but acknowledged nothing in time. Before raising, it holds the
key of every event of the batch. A problem of one event is a ``Failure``, never
a raise; any other exception is a bug and stops the relay.

*Acknowledged in time*: a publish that returned with at least one event
acknowledged and none ``timed_out``. Only that grows a batch size shrunk by
timeouts back and ends the timeouts' backoff: a batch whose events are all
held, unavailable, refused or failed says nothing of whether the broker
answers in time, so it leaves both as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from relay.events import Event, Outcome
from relay.holds import KeyHolds


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

    Several events of a key may be in flight at once: a run in one batch, and
    with ``chains_keys`` the key's next events in the next batches too, before
    the earlier ones are acknowledged. Given ``holds``, a sink calls
    ``holds.admit(event)`` as it hands each event to the broker, in order, and
    answers :data:`relay.events.HELD` for one it does not admit; it calls
    ``holds.hold`` for every event it will not report acknowledged (refused,
    failed, timed out, or raised for) as soon as it knows, and before it hands
    over the events of a later ``publish`` call. It must never let a later
    event of a key be acknowledged once an earlier one handed to it can no
    longer be (see :mod:`relay.holds`). :mod:`relay.sinks.keyorder` does
    this for every sink; a sink adds only what its broker needs.
    """

    name: str
    #: Whether the broker keeps a key's order across batches in flight at once,
    #: so the relay may claim a key's next events before the earlier ones are
    #: acknowledged.
    chains_keys: bool

    async def start(self) -> None:
        """Connect; raise ``SinkUnavailable`` if the broker cannot be reached."""

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        """Publish ``events`` and return one outcome per event."""

    async def check(self) -> None:
        """Raise ``SinkUnavailable`` unless the broker is reachable now."""

    async def close(self) -> None:
        """Flush what can be flushed and disconnect. Safe to call twice."""


def scrubbed(outcomes: list[Outcome], scrub: Callable[[str], str]) -> list[Outcome]:
    """``outcomes`` with ``scrub`` applied to each failure's text: it becomes ``last_error``,
    which ``outbox-relay dead`` shows, and a driver's message may echo a secret."""
    return [None if outcome is None else replace(outcome, error=scrub(outcome.error)) for outcome in outcomes]
