"""An in-memory store for unit tests, with the PostgreSQL store's semantics.

The conformance suite (tests/conformance) runs the same checks against both,
so the relay loop can be unit-tested here and trusted on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from relay.errors import StoreUnavailable
from relay.events import Event
from relay.store import batches
from relay.store.base import (
    Built,
    Claim,
    Dead,
    DeadEvent,
    ReplayFilter,
    RequeueFilter,
    Retry,
    RetryFilter,
    RetryingTopic,
    Settlement,
    Skipped,
    Started,
    Status,
    TopicLag,
    chained_keys,
    in_key_order,
    next_attempt,
)

#: The columns of a row that ``dead`` lists as they are.
_DEAD_COLUMNS = [f.name for f in fields(DeadEvent) if f.name != "blocked_events"]


@dataclass(slots=True)
class Row:
    """One outbox row."""

    id: int
    topic: str
    key: str | None
    payload: Any
    headers: dict[str, str]
    idempotency_key: str
    deliver_at: datetime
    priority: int = 0
    state: str = "pending"
    attempts: int = 0
    last_error: str | None = None
    lease_owner: str | None = None
    claim_token: UUID | None = None
    lease_expires_at: datetime | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    published_at: datetime | None = None
    failed_at: datetime | None = None
    content_type: str | None = None  # set for a bytes payload (``payload`` is then the bytes)

    def as_dict(self) -> dict[str, Any]:
        """Every column by name, as ``inspect`` shows it on PostgreSQL."""
        return {
            "id": self.id,
            "topic": self.topic,
            "key": self.key,
            "payload": None if self.content_type is not None else json.dumps(self.payload),
            "payload_bytes": self.payload if self.content_type is not None else None,
            "content_type": self.content_type,
            "headers": dict(self.headers),
            "idempotency_key": self.idempotency_key,
            "deliver_at": self.deliver_at,
            "priority": self.priority,
            "state": self.state,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "lease_owner": self.lease_owner,
            "claim_token": self.claim_token,
            "lease_expires_at": self.lease_expires_at,
            "created_at": self.created_at,
            "published_at": self.published_at,
            "failed_at": self.failed_at,
        }


class MemoryStore:
    """Rows in a dict; ``now`` can be moved forward to expire leases. Both ports: ``Store`` and ``Admin``."""

    def __init__(self, *, lease_seconds: float = 60.0, keep_sent: bool = False) -> None:
        self.rows: dict[int, Row] = {}
        self.lease_seconds = lease_seconds
        self.keep_sent = keep_sent
        self.available = True
        self.offset = timedelta(0)
        self._next_id = 1
        self._notify = asyncio.Event()

    def now(self) -> datetime:
        """The store's clock (real time plus ``offset``)."""
        return datetime.now(UTC) + self.offset

    def insert(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        deliver_at: datetime | None = None,
        priority: int = 0,
        content_type: str | None = None,
    ) -> int:
        """Add a committed event; returns its id (0 when the key already exists). Bytes as ``publish`` takes them."""
        idem = idempotency_key or str(uuid4())
        if any(r.idempotency_key == idem for r in self.rows.values()):
            return 0
        if isinstance(payload, bytes | bytearray | memoryview):
            payload, content_type = bytes(payload), content_type or "application/octet-stream"
        elif content_type is not None:
            raise ValueError("content_type goes with a bytes payload only")
        row = Row(self._next_id, topic, key, payload, dict(headers or {}), idem, deliver_at or self.now(), priority)
        row.content_type = content_type
        self.rows[row.id] = row
        self._next_id += 1
        self._notify.set()
        return row.id

    def _check(self) -> None:
        if not self.available:
            raise StoreUnavailable("memory store switched off")

    async def open(self) -> None:
        """Fail while unavailable."""
        self._check()

    async def close(self) -> None:
        """Nothing to close."""

    def _due(self, row: Row, max_attempts: int, now: datetime) -> bool:
        """Pending, due, and not leased (or its lease expired with attempts left)."""
        if row.state != "pending" or row.deliver_at > now:
            return False
        return row.lease_expires_at is None or (row.lease_expires_at < now and row.attempts < max_attempts)

    def _unsent(self, key: str) -> list[Row]:
        return sorted((r for r in self.rows.values() if r.key == key and r.state in ("pending", "failed")), key=_by_id)

    def _blocked(self, row: Row, max_attempts: int, now: datetime, tails: Collection[str]) -> bool:
        """Whether the oldest unsent event of the row's key, before it, is neither in flight
        nor due and ahead of it in the claim's order (see the claim in queries.sql). A key
        this relay has in flight (``tails``) is never blocked here: its run goes on after
        its tail or not at all (``_runs``)."""
        if row.key is None or row.key in tails:
            return False
        first = self._unsent(row.key)[0]
        if first.id >= row.id or first.state != "pending":
            return first.id < row.id
        if first.lease_expires_at is not None and first.lease_expires_at >= now:
            return False
        ahead = first.priority >= row.priority and first.deliver_at <= now
        return not (ahead and (first.lease_expires_at is None or first.attempts < max_attempts))

    @staticmethod
    def _in_flight(row: Row, tokens: set[UUID], now: datetime) -> bool:
        """Leased, still, by one of the batches of ``tokens``."""
        leased = row.lease_expires_at is not None and row.lease_expires_at > now
        return row.state == "pending" and leased and row.claim_token in tokens

    def _runs(self, candidates: list[Row], chain: Sequence[Claim], now: datetime) -> dict[int, bool]:
        """The candidates that make up runs (see the claim in queries.sql), each with whether it is chained."""
        ids = {r.id for r in candidates}
        tails = chained_keys(chain)
        tokens = {claim.token for claim in chain}
        chosen: dict[int, bool] = {}
        for key in {r.key for r in candidates if r.key is not None}:
            unsent = self._unsent(key)
            tail = tails.get(key)
            if tail is None:
                after, flying = unsent[:1], False
            else:
                row = self.rows.get(tail.id)
                if row is None or not self._in_flight(row, tokens, now):
                    continue
                after, flying = [r for r in unsent if r.id > tail.id][:1], True
                if after and after[0].topic != tail.topic:
                    continue
            if not after or after[0].id not in ids:
                continue
            head = after[0]
            for row in unsent[unsent.index(head) :]:
                if row.id not in ids or row.topic != head.topic:
                    break
                chosen[row.id] = flying or row.id > head.id
        for row in candidates:
            if row.key is None:
                chosen[row.id] = False
        return chosen

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        """:meth:`claim`, its events built at once."""
        return Built(await self.claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain))

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        """Lease runs of up to ``limit`` due events, their payloads and headers up to ``max_bytes`` (at least one)."""
        self._check()
        now = self.now()
        token = uuid4()
        tails = chained_keys(chain)
        candidates = sorted(
            (
                r
                for r in self.rows.values()
                if self._due(r, max_attempts, now) and not self._blocked(r, max_attempts, now, tails)
            ),
            key=lambda r: (-r.priority, r.id),
        )[:limit]
        runs = self._runs(candidates, chain, now)
        placed = [r for r in candidates if r.id in runs]
        # A key's event counts from the place of the latest of its run's earlier events: cut, never holed.
        place = {r.id: i for i, r in enumerate(placed)}
        at: dict[int, int] = {}
        latest: dict[str, int] = {}
        for row in sorted(placed, key=_by_id):
            if row.key is None:
                at[row.id] = place[row.id]
            else:
                at[row.id] = latest[row.key] = max(latest.get(row.key, -1), place[row.id])
        chosen, size = [], 0
        for row in sorted(placed, key=lambda r: (at[r.id], r.id)):
            if max_bytes is not None and size >= max_bytes:
                break
            chosen.append(row)
            size += len(self._as_event(row).payload) + _headers_bytes(row.headers)
        reaped = 0
        events = []
        for row in in_key_order(chosen, lambda r: (-r.priority, r.id), event=lambda r: r):
            reaped += row.lease_expires_at is not None
            row.claim_token = token
            row.lease_expires_at = now + timedelta(seconds=self.lease_seconds)
            row.attempts = next_attempt(row.attempts)
            events.append(replace(self._as_event(row), attempts=row.attempts, chained=runs[row.id]))
        return Claim(token=token, events=events, reaped=reaped)

    @staticmethod
    def _as_event(row: Row) -> Event:
        return Event(
            id=row.id,
            topic=row.topic,
            key=row.key,
            payload=row.payload if row.content_type is not None else json.dumps(row.payload).encode(),
            headers=dict(row.headers),
            idempotency_key=row.idempotency_key,
            attempts=row.attempts,
            created_at=row.created_at,
            content_type=row.content_type,
        )

    def _owned(self, claim: Claim, ids: Sequence[int]) -> list[Row]:
        return [r for i in ids if (r := self.rows.get(i)) is not None and r.claim_token == claim.token]

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        """Apply the outcomes where the lease is still ours."""
        self._check()
        now = self.now()
        done = self._owned(claim, sent)
        for row in done:
            if self.keep_sent:
                row.state, row.lease_expires_at, row.published_at = "sent", None, now
            else:
                del self.rows[row.id]
        retried = 0
        for item in retry:
            for row in self._owned(claim, [item.id]):
                row.claim_token = row.lease_expires_at = None
                row.deliver_at = now + timedelta(seconds=item.delay_seconds)
                row.last_error = item.error
                retried += 1
        buried = 0
        for grave in dead:
            for row in self._owned(claim, [grave.id]):
                row.claim_token = row.lease_expires_at = None
                row.state, row.last_error, row.failed_at = "failed", grave.error, now
                buried += 1
        lost = len(sent) + len(retry) + len(dead) - len(done) - retried - buried
        return Settlement(sent=len(done), retried=retried, dead=buried, lost=lost)

    async def renew(self, claim: Claim) -> set[int]:
        """Start the lease again for the claim's events it still holds, while their lease holds."""
        self._check()
        now = self.now()
        lease_ends = now + timedelta(seconds=self.lease_seconds)
        owned = self._owned(claim, [e.id for e in claim.events])
        kept = [
            r for r in owned if r.state == "pending" and r.lease_expires_at is not None and r.lease_expires_at >= now
        ]
        for row in kept:
            row.lease_expires_at = lease_ends
        return {row.id for row in kept}

    async def release(self, claim: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Give events back without counting the attempt, due again after ``delay_seconds``."""
        self._check()
        now = self.now()
        for row in self._owned(claim, ids):
            row.claim_token = row.lease_expires_at = None
            row.attempts = max(0, row.attempts - 1)
            if delay_seconds > 0:
                row.deliver_at = now + timedelta(seconds=delay_seconds)

    async def reap(self, *, max_attempts: int) -> int:
        """Dead-letter expired leases with no attempts left."""
        self._check()
        now = self.now()
        count = 0
        for row in self.rows.values():
            if (
                row.state == "pending"
                and row.lease_expires_at is not None
                and row.lease_expires_at < now
                and row.attempts >= max_attempts
            ):
                # The lease's end stays, for skip (see reap_exhausted in queries.sql).
                row.state, row.failed_at, row.claim_token = "failed", now, None
                row.last_error = f"lease expired on attempt {row.attempts}: the relay holding it crashed or stalled"
                count += 1
        return count

    async def wait(self, timeout: float) -> bool:
        """Wait for an insert."""
        self._notify.clear()
        try:
            await asyncio.wait_for(self._notify.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def status(self, *, topics: int = 0) -> Status:
        """The same counts as the PostgreSQL store; with ``topics``, per topic."""
        self._check()
        now = self.now()
        rows = list(self.rows.values())
        live = [
            r for r in rows if r.state == "pending" and r.lease_expires_at is not None and r.lease_expires_at >= now
        ]
        pending = [r for r in rows if r.state == "pending" and r not in live]
        due = [r.created_at for r in pending if r.deliver_at <= now]
        failed = [r for r in rows if r.state == "failed"]
        scheduled = [r for r in pending if r.deliver_at > now]
        # Keys whose oldest unsent event is the one not due yet, with a due event behind it
        # (a key behind a dead letter is parked, not waiting on a schedule).
        waiting = {
            r.key
            for r in scheduled
            if r.key is not None
            and self._unsent(r.key)[0] is r
            and any(o.key == r.key and o.id > r.id and o.state == "pending" and o.deliver_at <= now for o in rows)
        }
        lag = self._lag(pending, now)
        retrying = [r for r in rows if self._retrying(r, now)]
        return Status(
            pending=len(pending),
            in_flight=len(live),
            failed=len(failed),
            oldest_pending_age_seconds=max(0.0, (now - min(due)).total_seconds()) if due else 0.0,
            parked_keys=len({r.key for r in failed if r.key is not None}),
            scheduled=len(scheduled),
            keys_waiting_on_schedule=len(waiting),
            retrying=len(retrying),
            oldest_retrying_age_seconds=max((_age(r.created_at, now) for r in retrying), default=0.0),
            retrying_topics=self._retrying_topics(rows, now, topics),
            topics=tuple(lag[:topics]),
            topic_count=len(lag),
        )

    @staticmethod
    def _retrying(row: Row, now: datetime) -> bool:
        """Failing and retrying (:func:`relay.store.base.is_retrying`)."""
        leased = row.lease_expires_at is not None and row.lease_expires_at >= now
        return row.state == "pending" and row.attempts > (1 if leased else 0)

    def _retrying_topics(self, rows: list[Row], now: datetime, limit: int) -> tuple[RetryingTopic, ...]:
        by_topic: dict[str, list[Row]] = {}
        for row in sorted(rows, key=_by_id):
            if self._retrying(row, now):
                by_topic.setdefault(row.topic, []).append(row)
        found = [
            RetryingTopic(
                topic=topic,
                retrying=len(retrying),
                oldest_age_seconds=_age(min(r.created_at for r in retrying), now),
                event_id=retrying[0].id,
                attempts=retrying[0].attempts,
                last_error=retrying[0].last_error,
                next_attempt_in_seconds=max(0.0, (retrying[0].deliver_at - now).total_seconds()),
            )
            for topic, retrying in by_topic.items()
        ]
        return tuple(sorted(found, key=lambda t: (-t.oldest_age_seconds, t.topic))[:limit])

    @staticmethod
    def _lag(pending: list[Row], now: datetime) -> list[TopicLag]:
        by_topic: dict[str, list[Row]] = {}
        for row in pending:
            by_topic.setdefault(row.topic, []).append(row)
        lag = [
            TopicLag(
                topic,
                len(waiting),
                max((_age(r.created_at, now) for r in waiting if r.deliver_at <= now), default=0.0),
            )
            for topic, waiting in by_topic.items()
        ]
        return sorted(lag, key=lambda t: (-t.oldest_pending_age_seconds, -t.pending, t.topic))

    async def gauges(self) -> Status:
        """The exact counts: a memory store is always small (every retrying topic, as the other stores' gauges)."""
        return await self.status(topics=len(self.rows))

    async def oldest_pending_age(self) -> float:
        """The same age ``status`` reports."""
        return (await self.status()).oldest_pending_age_seconds

    async def check(self) -> None:
        """Fail while unavailable."""
        self._check()

    async def dead(self, limit: int = 1000, *, topic: str | None = None) -> list[DeadEvent]:
        """Dead-lettered events, oldest first; with ``topic``, of that topic only."""
        self._check()
        rows = sorted((r for r in self.rows.values() if r.state == "failed" and topic in (None, r.topic)), key=_by_id)[
            :limit
        ]
        return [
            DeadEvent(**{name: getattr(r, name) for name in _DEAD_COLUMNS}, blocked_events=self._behind(r))
            for r in rows
        ]

    def _behind(self, dead: Row) -> int:
        """How many pending events of its key a dead letter holds back."""
        return sum(
            1
            for o in self.rows.values()
            if dead.key is not None and o.key == dead.key and o.id > dead.id and o.state == "pending"
        )

    def _batches(self, matches: Callable[[Row], bool]) -> batches.Select:
        """The next batch of the rows ``matches`` takes, as the SQL stores select one."""

        async def select(after: int | None, limit: int) -> list[int]:
            self._check()
            found = sorted(r.id for r in self.rows.values() if (after is None or r.id > after) and matches(r))
            return found[:limit]

        return select

    async def requeue(
        self,
        selection: RequeueFilter,
        *,
        dry_run: bool = False,
        batch_size: int = batches.ADMIN_BATCH_SIZE,
        progress: batches.Progress | None = None,
    ) -> list[int]:
        """Put matching dead-lettered events back with attempts reset, a batch at a time."""

        def matches(row: Row) -> bool:
            return (
                row.state == "failed"
                and selection.id in (None, row.id)
                and selection.topic in (None, row.topic)
                and (selection.key is None or row.key == selection.key)
            )

        async def change(ids: list[int]) -> list[int]:
            self._check()
            done = [i for i in ids if i in self.rows and matches(self.rows[i])]
            for event_id in done:
                row = self.rows[event_id]
                row.state, row.attempts, row.failed_at, row.deliver_at = "pending", 0, None, self.now()
            return done

        return await batches.walk(
            self._batches(matches), None if dry_run else change, batch_size=batch_size, progress=progress
        )

    async def retry_now(self, selection: RetryFilter) -> list[int]:
        """Make matching retrying events due now, attempts kept."""
        self._check()
        now, ids = self.now(), []
        for row in sorted(self.rows.values(), key=_by_id):
            live = row.lease_expires_at is not None and row.lease_expires_at >= now
            if row.state != "pending" or row.attempts <= 0 or live:
                continue
            if selection.id not in (None, row.id) or selection.topic not in (None, row.topic):
                continue
            row.deliver_at = now
            ids.append(row.id)
        return ids

    async def inspect(self, event_id: int) -> dict[str, Any] | None:
        """Every column of one event, or None."""
        self._check()
        row = self.rows.get(event_id)
        return row.as_dict() if row else None

    async def purge(
        self,
        older_than_seconds: float,
        *,
        dry_run: bool = False,
        batch_size: int = batches.ADMIN_BATCH_SIZE,
        progress: batches.Progress | None = None,
    ) -> int:
        """Delete sent and skipped events older than the cut-off (a skipped one aged from its skip)."""
        cutoff = self.now() - timedelta(seconds=older_than_seconds)

        def matches(row: Row) -> bool:
            return row.state in ("sent", "skipped") and (row.published_at or row.failed_at or row.created_at) < cutoff

        async def change(ids: list[int]) -> list[int]:
            self._check()
            done = [i for i in ids if i in self.rows and matches(self.rows[i])]
            for event_id in done:
                del self.rows[event_id]
            return done

        found = await batches.walk(
            self._batches(matches), None if dry_run else change, batch_size=batch_size, progress=progress
        )
        return len(found)

    async def replay(
        self,
        selection: ReplayFilter,
        *,
        dry_run: bool = False,
        batch_size: int = batches.ADMIN_BATCH_SIZE,
        progress: batches.Progress | None = None,
    ) -> list[int]:
        """Put matching sent events back to pending, a batch at a time."""

        def matches(row: Row) -> bool:
            sent = row.published_at
            return (
                row.state == "sent"
                and sent is not None
                and (selection.since is None or sent >= selection.since)
                and (selection.until is None or sent < selection.until)
                and (selection.key is None or row.key == selection.key)
                and selection.topic in (None, row.topic)
            )

        async def change(ids: list[int]) -> list[int]:
            self._check()
            done = [i for i in ids if i in self.rows and matches(self.rows[i])]
            for event_id in done:
                row = self.rows[event_id]
                row.state, row.attempts, row.deliver_at, row.published_at = "pending", 0, self.now(), None
                row.lease_expires_at = row.claim_token = row.lease_owner = None
            return done

        return await batches.walk(
            self._batches(matches), None if dry_run else change, batch_size=batch_size, progress=progress
        )

    async def skip(self, event_id: int, *, lease_grace_seconds: float, dry_run: bool = False) -> Skipped:
        """Mark one dead-lettered or waiting event skipped; refuse one that may be in flight."""
        self._check()
        row = self.rows.get(event_id)
        if row is None or row.state not in ("pending", "failed"):
            return Skipped.NOT_FOUND
        grace_ends = self.now() - timedelta(seconds=lease_grace_seconds)
        if row.lease_expires_at is not None and row.lease_expires_at >= grace_ends:
            return Skipped.IN_FLIGHT
        if dry_run:
            return Skipped.SKIPPED
        # failed_at holds the skip: retention ages a skipped event from it (docs/operations.md).
        row.state, row.claim_token, row.lease_expires_at, row.failed_at = "skipped", None, None, self.now()
        row.last_error = ("" if row.last_error is None else row.last_error + " ") + "[skipped by operator]"
        return Skipped.SKIPPED


def _by_id(row: Row) -> int:
    return row.id


def _age(created_at: datetime, now: datetime) -> float:
    """Seconds since ``created_at``, never below 0 (a time ahead of the clock)."""
    return max(0.0, (now - created_at).total_seconds())


def _headers_bytes(headers: dict[str, str]) -> int:
    """What an event's headers count toward the byte cap: their JSON text, nothing when there are none."""
    return len(json.dumps(headers).encode()) if headers else 0
