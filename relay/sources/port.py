"""The source port: where events come from, and how their delivery is confirmed.

The loop (:mod:`relay.loop`) and a batch's life (:mod:`relay.batch`) talk to
a source through this port only. A batch is taken in two steps, so that the
next take can reach the database while this one's events are built: a take
returns once the source has leased the events (:class:`Started`), with the
batches in hand (``chain``) it may go on from. A judged batch is confirmed
(settled) within its lease; one that will not be published goes back, due
again after a delay; one that waited too long renews its lease first.

The table claim (:class:`relay.sources.table.TableSource`) is the first
adapter. What is not about taking and confirming batches (the operator's
commands, dead letters, the gauges, the reaper of dead relays' leases) stays
on the store (:class:`relay.store.base.Store`).

The log (:class:`relay.sources.log.source.LogSource`) is the second, and
leases nothing: its events are in hand from the slot until confirmed, a take
skips the keys that must wait (in flight, waiting for a retry, parked), a
confirm marks events done (the slot's position follows the done prefix, in
the background), a give-back keeps events in memory until due, and a renewal
keeps every event. Its ``lease_ends`` bounds nothing; the loop, given no
store, reaps no leases (:class:`relay.loop.Relay`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from relay.store.base import Claim, Dead, Retry, Settlement, Started

__all__ = ["Claim", "Dead", "Retry", "Settlement", "Source", "Started"]


class Source(Protocol):
    """Where a relay takes its batches, and confirms their delivery."""

    async def open(self) -> None:
        """Connect; raise ``StoreUnavailable`` or ``SchemaError`` if the source cannot be used."""

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the source answers now and can confirm (a standby cannot)."""

    async def close(self) -> None:
        """Disconnect. Safe to call twice."""

    async def take(self, limit: int, *, max_bytes: int, chain: Sequence[Claim] = ()) -> Started:
        """Lease up to ``limit`` due events (stopping at ``max_bytes`` of payload), going on with the keys
        of ``chain`` (the batches in hand); returns before the events are built (:meth:`Started.events`).
        A take that runs out of time raises ``ClaimTimeout``."""

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
        """Record a judged batch's outcomes, then give back ``release`` (``{delay_seconds: ids}``), trying
        through outages until ``lease_ends`` (monotonic); None if nothing was settled or the lease ended."""

    async def give_back(self, batch: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Give ``ids`` of ``batch`` back unpublished, no attempt spent, due again after ``delay_seconds``."""

    async def renew(self, batch: Claim) -> set[int]:
        """Start the lease of ``batch`` again from now; the ids it still holds (see :meth:`Store.renew`)."""

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for news of new events; True if some came. Only a speed-up:
        the loop polls anyway."""
