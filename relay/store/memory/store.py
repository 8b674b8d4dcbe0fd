"""The memory store's hot path (the ``Store`` port): claim, settle, renew, release, reap and wait, with
the PostgreSQL claim's rules (runs per key, chains, priorities, byte caps)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from uuid import UUID, uuid4

from relay.events import Event
from relay.store.base import (
    Built,
    Claim,
    Dead,
    Retry,
    Settlement,
    Started,
    chained_keys,
    in_key_order,
    next_attempt,
)
from relay.store.claims import within_bytes
from relay.store.memory.admin import MemoryAdmin
from relay.store.memory.rows import Row


class MemoryStore(MemoryAdmin):
    """Rows in a dict; ``now`` can be moved forward to expire leases. Both ports: ``Store`` and ``Admin``."""

    def _due(self, row: Row, max_attempts: int, now: datetime) -> bool:
        """Pending, due, and not leased (or its lease expired with attempts left)."""
        if row.state != "pending" or row.deliver_at > now:
            return False
        if row.lease_expires_at is None or row.claim_token is None:  # never leased, or settled (see retry)
            return True
        return row.lease_expires_at < now and row.attempts < max_attempts

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
        return not (
            ahead and (first.lease_expires_at is None or first.claim_token is None or first.attempts < max_attempts)
        )

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
        chosen = within_bytes(
            placed, max_bytes, size=lambda r: len(self._as_event(r).payload) + _headers_bytes(r.headers)
        )
        taken_over = set()
        events = []
        for row in in_key_order(chosen, lambda r: (-r.priority, r.id), event=lambda r: r):
            if row.lease_expires_at is not None:
                taken_over.add(row.id)
            row.claim_token = token
            row.lease_expires_at = now + timedelta(seconds=self.lease_seconds)
            row.attempts = next_attempt(row.attempts)
            events.append(replace(self._as_event(row), attempts=row.attempts, chained=runs[row.id]))
        return Claim(token=token, events=events, taken_over=frozenset(taken_over))

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
                row.claim_token, row.lease_expires_at = None, _lease_ended(claim, row, now)
                row.deliver_at = now + timedelta(seconds=item.delay_seconds)
                row.last_error = item.error
                retried += 1
        buried = 0
        for grave in dead:
            for row in self._owned(claim, [grave.id]):
                row.claim_token, row.lease_expires_at = None, _lease_ended(claim, row, now)
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
            row.claim_token, row.lease_expires_at = None, _lease_ended(claim, row, now)
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
                and row.claim_token is not None  # a settled event is held by no relay (reap_exhausted)
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


def _lease_ended(claim: Claim, row: Row, now: datetime) -> datetime | None:
    """The lease end a settle or release leaves: none, or now for an event the claim took over (as
    lease_ended in relay/store/queries.sql)."""
    return now if row.id in claim.taken_over else None


def _headers_bytes(headers: dict[str, str]) -> int:
    """What an event's headers count toward the byte cap: their JSON text, nothing when there are none."""
    return len(json.dumps(headers).encode()) if headers else 0
