"""The memory store's table: its rows (:class:`Row`, every column of the outbox table), its clock, and
what writers and both ports share (insert, availability)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

from relay.errors import StoreUnavailable


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


class Rows:
    """The table: rows in a dict, a clock that ``offset`` moves forward (to expire leases), and a
    switch (``available``) that makes every call fail as a database that went away would."""

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

    async def check(self) -> None:
        """Fail while unavailable."""
        self._check()

    def _unsent(self, key: str) -> list[Row]:
        return sorted((r for r in self.rows.values() if r.key == key and r.state in ("pending", "failed")), key=_by_id)


def _by_id(row: Row) -> int:
    return row.id


def _age(created_at: datetime, now: datetime) -> float:
    """Seconds since ``created_at``, never below 0 (a time ahead of the clock)."""
    return max(0.0, (now - created_at).total_seconds())
