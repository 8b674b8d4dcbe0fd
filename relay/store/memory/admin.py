"""The memory store's counts (``status``, the gauges) and the operator's commands: dead letters,
``requeue``, ``retry``, ``inspect``, ``purge``, ``replay`` and ``skip``, as the SQL stores do them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timedelta
from typing import Any

from relay.store import batches
from relay.store.base import (
    DeadEvent,
    ReplayFilter,
    RequeueFilter,
    RetryFilter,
    RetryingTopic,
    Skipped,
    Status,
    TopicLag,
)
from relay.store.memory.rows import Row, Rows, _age, _by_id

#: The columns of a row that ``dead`` lists as they are.
_DEAD_COLUMNS = [f.name for f in fields(DeadEvent) if f.name != "blocked_events"]


class MemoryAdmin(Rows):
    """The operator's side of the memory store (the ``Admin`` port), and the counts both ports read."""

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
