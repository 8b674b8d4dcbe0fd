"""The store ports: the database side of the relay (``Store``) and of its operators (``Admin``).

The values they take and give have rooms of their own, and stay importable from here:
:mod:`relay.store.claims` (a claim, its outcomes, the key rules every store shares),
:mod:`relay.store.status` (the counts) and :mod:`relay.store.admin_values` (the operator's commands).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from relay.store.admin_values import (
    DeadEvent,
    ReplayFilter,
    RequeueFilter,
    RetryFilter,
    Skipped,
    key_bytes,
    undecodable,
)
from relay.store.batches import ADMIN_BATCH_SIZE, Progress
from relay.store.claims import (
    MAX_ATTEMPTS_COUNT,
    Built,
    Claim,
    Dead,
    Retry,
    Settlement,
    Started,
    chained_keys,
    in_key_order,
    next_attempt,
    tails_of,
)
from relay.store.status import RetryingTopic, Status, TopicLag, is_retrying, oldest_of

__all__ = [
    "MAX_ATTEMPTS_COUNT",
    "Admin",
    "Built",
    "Claim",
    "Dead",
    "DeadEvent",
    "ReplayFilter",
    "RequeueFilter",
    "Retry",
    "RetryFilter",
    "RetryingTopic",
    "Settlement",
    "Skipped",
    "Started",
    "Status",
    "Store",
    "TopicLag",
    "chained_keys",
    "in_key_order",
    "is_retrying",
    "key_bytes",
    "next_attempt",
    "oldest_of",
    "tails_of",
    "undecodable",
]


class Store(Protocol):
    """The relay's view of the outbox table."""

    async def open(self) -> None:
        """Connect and check the table exists; raise ``StoreUnavailable`` or ``SchemaError``."""

    async def close(self) -> None:
        """Disconnect. Safe to call twice."""

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        """Lease up to ``limit`` due events, honouring per-key order.

        A key's events come as a run, in id order, to one topic. ``chain`` holds
        this relay's batches in flight whose leases still hold: a key with
        events in them goes on after the last of those (its next events marked
        ``chained``), to the same topic only. Without it, a key with an event
        in flight anywhere waits.

        With ``max_bytes`` the batch stops adding events once their payloads
        reach that many bytes; it always holds at least one. A claim that runs
        out of time raises ``ClaimTimeout``: claim fewer events, or fewer bytes.
        The events come highest priority first, except that each key's come in
        id order (see :func:`in_key_order`).
        """

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        """:meth:`claim`, returning once the database has leased the events, before they are built:
        a next claim may start, going on from :meth:`Started.tails`, while they are."""

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        """Record the outcome of a published batch, only where the lease is still ours."""

    async def renew(self, claim: Claim) -> set[int]:
        """Start the lease of the claim's events again from now; return the ids it still holds.

        For a batch that waited so long after its claim (a payload that takes
        seconds to read, a stalled process) that its lease could end before
        the publish and the settle are done. Only an event whose lease still
        holds is renewed: its claim token matches and the lease has not ended,
        on the database's clock, in the statement that renews it. An event
        another relay took over, that was dead-lettered or settled meanwhile,
        or whose lease ended (another relay's reaper may have acted on its
        key since) is not renewed and not returned.
        """

    async def release(self, claim: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Give events back unpublished, without counting the attempt.

        With ``delay_seconds`` they are due again only that much later (their
        broker is down); they stay the oldest unsent events of their keys, so
        later events of those keys keep waiting for them.
        """

    async def reap(self, *, max_attempts: int) -> int:
        """Dead-letter events whose lease expired with no attempts left."""

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a new-event notification; True if one came."""

    async def status(self) -> Status:
        """Pending, in-flight and dead-lettered counts."""

    async def gauges(self) -> Status:
        """``status`` for the relay's gauges: exact on a small table, cheap on any (estimates past a bound)."""

    async def oldest_pending_age(self) -> float:
        """Seconds since the oldest due event that no live lease holds was written; cheap at any table size."""

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the database answers now and takes writes."""


class Admin(Protocol):
    """The operator's view of the outbox table: the commands behind ``status``,
    ``dead``, ``requeue``, ``skip``, ``inspect``, ``purge`` and ``replay``.

    Every call is bounded in time: a database that stops answering raises
    ``StoreUnavailable`` instead of hanging.
    """

    async def open(self) -> None:
        """Connect and check the table exists; raise ``StoreUnavailable`` or ``SchemaError``."""

    async def close(self) -> None:
        """Disconnect. Safe to call twice."""

    async def status(self, *, topics: int = 0) -> Status:
        """Exact pending, in-flight, retrying and dead-lettered counts.

        With ``topics``, also the lag of that many topics and their retrying
        events, those with the oldest events first (``Status.topics`` and
        ``Status.retrying_topics``).
        """

    async def dead(self, limit: int = 1000, *, topic: str | None = None) -> list[DeadEvent]:
        """Dead-lettered events, oldest first, at most ``limit``; with ``topic``, of that topic only."""

    async def requeue(
        self,
        selection: RequeueFilter,
        *,
        dry_run: bool = False,
        batch_size: int = ADMIN_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> list[int]:
        """Put matching dead-lettered events back to pending, attempts reset; their ids.

        In batches of ``batch_size`` in id order, each its own transaction
        (``relay.store.batches``); ``progress`` hears of each one. With
        ``dry_run``, nothing changes: the ids are those it would put back.
        """

    async def retry_now(self, selection: RetryFilter) -> list[int]:
        """Make matching retrying events (pending, not in flight, attempts > 0) due now; their ids.

        Their attempts stay as they are: ``--max-attempts`` still bounds them.
        """

    async def skip(self, event_id: int, *, lease_grace_seconds: float, dry_run: bool = False) -> Skipped:
        """Mark one dead-lettered or waiting event skipped, releasing its key.

        An event whose lease is live, or ended less than ``lease_grace_seconds``
        ago (a relay's publish may outlast its lease), is refused: ``IN_FLIGHT``.
        The skip is its ``failed_at``: what ``purge`` ages a skipped event from.
        With ``dry_run``, what it would do, changing nothing.
        """

    async def inspect(self, event_id: int) -> dict[str, Any] | None:
        """Every column of one event by name, or None when there is no such event."""

    async def purge(
        self,
        older_than_seconds: float,
        *,
        dry_run: bool = False,
        batch_size: int = ADMIN_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> int:
        """Delete sent and skipped events older than the cut-off, in batches; how many. Unsent events are
        never touched. A sent event's age runs from its publish, a skipped one's from its skip."""

    async def replay(
        self,
        selection: ReplayFilter,
        *,
        dry_run: bool = False,
        batch_size: int = ADMIN_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> list[int]:
        """Put matching kept (sent) events back to pending with their idempotency keys; their ids.

        In batches, as :meth:`requeue`."""
