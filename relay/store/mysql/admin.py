"""The operator's commands on MySQL: status, dead letters, requeue, skip, inspect, purge, replay."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from relay.config import CONNECT_TIMEOUT_SECONDS, TableName, redact_url
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
    undecodable,
)
from relay.store.mysql.connection import Database, rows_of, transaction

#: Purge's batch: the one every operator's command takes (kept under its old name).
PURGE_BATCH_SIZE = batches.ADMIN_BATCH_SIZE
#: At most this many distinct priorities are probed one by one for the oldest pending age; the
#: rest are read in one scan.
MAX_PRIORITIES = 100


#: What the driver returns for a VARBINARY column (a tuple: isinstance with one is the fastest check).
_BINARY = (bytes, bytearray)


def text(value: Any) -> Any:
    """A VARBINARY column (``key``, ``idempotency_key``) as text.

    Any bytes fit those columns, and a writer whose connection is not UTF-8
    stores its text in that charset. Bytes that are not UTF-8 come back as the
    same text with their bad bytes escaped as lone surrogates: two keys stay
    one key exactly when their bytes are the same, and :func:`undecodable`
    tells such text apart (the claim dead-letters its row; see
    ``relay/store/mysql/store.py``).
    """
    return value.decode("utf-8", "surrogateescape") if isinstance(value, _BINARY) else value


def binary(value: str) -> bytes:
    """Text from :func:`text` as the bytes of its column again (a key to compare in SQL)."""
    return value.encode("utf-8", "surrogateescape")


def readable(value: Any) -> Any:
    """Text from :func:`text` as an operator can read and print it: bad bytes shown as ``\\xNN``."""
    if not undecodable(value):
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _key(key: str | None) -> bytes | None:
    """A key to select by, as the bytes its VARBINARY column holds (``--key-hex`` may name bytes that are
    not UTF-8)."""
    return None if key is None else binary(key)


#: "No lease" in lease_expires_at, which is never NULL (migrations/0007_fixed_width_lease.sql; claim_token and
#: lease_owner hold '' then): the smallest DATETIME, before every clock.
NO_LEASE = datetime(1000, 1, 1)


def utc(value: Any) -> Any:
    """A DATETIME(6) column (UTC, read naive) as an aware datetime."""
    return value.replace(tzinfo=UTC) if isinstance(value, datetime) else value


def naive_utc(value: datetime | None) -> datetime | None:
    """An aware datetime as the naive UTC a DATETIME(6) column compares with."""
    if value is None:
        return None
    try:
        return value.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:  # past year 9999 or before year 1 in UTC: as far as a datetime goes
        return datetime.max if value.year > 1 else datetime.min


def micros(seconds: float) -> int:
    """Seconds as the whole microseconds of an ``INTERVAL … MICROSECOND``."""
    return max(0, round(seconds * 1_000_000))


class MySQLAdmin:
    """The outbox table as operators see it (the ``Admin`` port) on MySQL 8 or MariaDB."""

    def __init__(
        self,
        url: str,
        table: TableName,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        statement_timeout: float | None = None,
    ) -> None:
        self._db = Database(url, table, connect_timeout=connect_timeout, statement_timeout=statement_timeout)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self._db.url)!r}, table={str(self._db.table)!r})"

    @property
    def table(self) -> TableName:
        """The outbox table these commands work on."""
        return self._db.table

    async def open(self) -> None:
        """Connect and check the table; raise ``StoreUnavailable`` or ``SchemaError``."""
        await self._db.open()

    async def close(self) -> None:
        """Close every connection. Safe to call twice."""
        await self._db.close()

    async def status(self, *, topics: int = 0) -> Status:
        """Exact counts of pending, in-flight, retrying and dead-lettered events; with ``topics``, per topic."""
        row = (await self._db.fetch("status", lane="stats"))[0]
        waiting = (await self._db.fetch("keys_waiting_on_schedule", lane="stats"))[0]
        found = Status(
            pending=int(row["pending"]),
            in_flight=int(row["in_flight"]),
            failed=int(row["failed"]),
            oldest_pending_age_seconds=await self.oldest_pending_age(),
            parked_keys=int(row["parked_keys"]),
            scheduled=int(row["scheduled"]),
            keys_waiting_on_schedule=int(waiting["waiting"]),
            retrying=int(row["retrying"]),
            oldest_retrying_age_seconds=float(row["oldest_retrying_age_seconds"]),
        )
        if not topics:
            return found
        lag = await self._db.fetch("topic_lag", {"limit": topics}, lane="stats")
        return replace(
            found,
            retrying_topics=await self._retrying_topics(topics),
            topics=tuple(
                TopicLag(text(r["topic"]), int(r["pending"]), float(r["oldest_pending_age_seconds"])) for r in lag
            ),
            topic_count=int(lag[0]["topic_count"]) if lag else 0,
        )

    async def _retrying_topics(self, limit: int) -> tuple[RetryingTopic, ...]:
        """The topics with retrying events, oldest first, each with its first one's attempts and error."""
        found = await self._db.fetch("retrying_topics", {"limit": limit}, lane="stats")
        if not found:
            return ()
        firsts = await self._db.fetch("retrying_firsts", {"ids": tuple(r["event_id"] for r in found)}, lane="stats")
        by_id = {r["id"]: r for r in firsts}
        # An event settled between the two reads has no first any more: shown without one.
        gone = {"attempts": 0, "last_error": None, "next_attempt_in_seconds": 0}
        return tuple(
            RetryingTopic(
                topic=text(r["topic"]),
                retrying=int(r["retrying"]),
                oldest_age_seconds=float(r["oldest_age_seconds"]),
                event_id=int(r["event_id"]),
                attempts=int(first["attempts"]),
                last_error=first["last_error"],
                next_attempt_in_seconds=float(first["next_attempt_in_seconds"]),
            )
            for r in found
            for first in [by_id.get(r["event_id"], gone)]
        )

    async def oldest_pending_age(self) -> float:
        """Seconds since the oldest due event that no live lease holds was written.

        A loose index scan over the claim index, in Python: each distinct
        priority (one probe each), then the lowest due id of each.
        """

        async def work(cur: Any) -> float:
            queries = self._db.queries
            oldest, below = 0.0, 2**31
            for _ in range(MAX_PRIORITIES):
                await cur.execute(queries["top_priority_below"], {"below": below})
                priority = (await cur.fetchone())[0]
                if priority is None:
                    return oldest
                await cur.execute(queries["oldest_due_of_priority"], {"priority": priority})
                found = await cur.fetchone()
                if found is not None and found[0] is not None:  # NULL: no row (or none with a date)
                    oldest = max(oldest, float(found[0]))
                below = priority
            await cur.execute(queries["oldest_due_below"], {"below": below})
            found = await cur.fetchone()
            return max(oldest, float(found[0])) if found is not None and found[0] is not None else oldest

        return await self._db.call("stats", work)

    async def dead(self, limit: int = 1000, *, topic: str | None = None) -> list[DeadEvent]:
        """Dead-lettered events, oldest first; with ``topic``, of that topic only."""
        if undecodable(topic):
            return []  # bytes that are not UTF-8 (a command-line argument): no topic holds them
        rows = await self._db.fetch("dead", {"limit": limit, "topic": topic})
        return [
            DeadEvent(
                id=r["id"],
                topic=r["topic"],
                key=text(r["key"]),  # bad bytes kept (as lone surrogates): the CLI shows such a key in hex
                idempotency_key=readable(text(r["idempotency_key"])),
                attempts=r["attempts"],
                last_error=r["last_error"],
                created_at=utc(r["created_at"]),
                failed_at=utc(r["failed_at"]),
                blocked_events=int(r["blocked_events"]),
            )
            for r in rows
        ]

    def _select(self, name: str, params: dict[str, Any]) -> batches.Select:
        """The next batch of the selection query ``name`` takes."""

        async def select(after: int | None, limit: int) -> list[int]:
            rows = await self._db.fetch(name, {**params, "after": after, "limit": limit})
            return [int(row["id"]) for row in rows]

        return select

    def _lock_then_update(self, state: str, update: str) -> batches.Change:
        """One batch: lock its rows that are still in ``state`` and run ``update`` on them, in one
        transaction; the ids it changed (a row another operator changed meanwhile is left out)."""

        async def change(ids: list[int]) -> list[int]:
            async def work(cur: Any) -> list[int]:
                async def steps() -> list[int]:
                    await cur.execute(self._db.queries["lock_in_state"], {"ids": tuple(ids), "state": state})
                    locked = [int(row[0]) for row in await cur.fetchall()]
                    if locked:
                        await cur.execute(self._db.queries[update], {"ids": tuple(locked)})
                    return locked

                return await transaction(cur, steps)

            return await self._db.call("main", work)

        return change

    async def requeue(
        self,
        selection: RequeueFilter,
        *,
        dry_run: bool = False,
        batch_size: int = batches.ADMIN_BATCH_SIZE,
        progress: batches.Progress | None = None,
    ) -> list[int]:
        """Put matching dead-lettered events back to pending with their attempts reset, a batch at a time."""
        params = {"id": selection.id, "topic": selection.topic, "key": _key(selection.key)}
        return await batches.walk(
            self._select("requeue_select", params),
            None if dry_run else self._lock_then_update("failed", "requeue"),
            batch_size=batch_size,
            progress=progress,
        )

    async def _select_then_update(self, select: str, update: str, params: dict[str, Any]) -> list[int]:
        """Lock the rows ``select`` finds and run ``update`` on them, in one transaction; their ids."""

        async def work(cur: Any) -> list[int]:
            async def steps() -> list[int]:
                await cur.execute(self._db.queries[select], params)
                ids = [int(row[0]) for row in await cur.fetchall()]
                if ids:
                    await cur.execute(self._db.queries[update], {"ids": tuple(ids)})
                return ids

            return await transaction(cur, steps)

        return await self._db.call("main", work)

    async def retry_now(self, selection: RetryFilter) -> list[int]:
        """Make matching retrying events due now, attempts kept; their ids."""
        if undecodable(selection.topic):
            return []  # as in dead
        params = {"id": selection.id, "topic": selection.topic}
        return await self._select_then_update("retry_now_select", "retry_now", params)

    async def replay(
        self,
        selection: ReplayFilter,
        *,
        dry_run: bool = False,
        batch_size: int = batches.ADMIN_BATCH_SIZE,
        progress: batches.Progress | None = None,
    ) -> list[int]:
        """Put kept, already-sent events back to pending, a batch at a time; returns their ids."""
        params = {
            "since": naive_utc(selection.since),
            "until": naive_utc(selection.until),
            "key": _key(selection.key),
            "topic": selection.topic,
        }
        return await batches.walk(
            self._select("replay_select", params),
            None if dry_run else self._lock_then_update("sent", "replay"),
            batch_size=batch_size,
            progress=progress,
        )

    async def inspect(self, event_id: int) -> dict[str, Any] | None:
        """Every column of one event, or None."""
        rows = await self._db.fetch("inspect", {"id": event_id})
        if not rows:
            return None
        # payload_bytes stays bytes, as PostgreSQL gives a bytea; the VARBINARY text columns are decoded.
        row = {
            name: value if name == "payload_bytes" else text(value) if name == "key" else utc(readable(text(value)))
            for name, value in rows[0].items()
        }
        # MariaDB's JSON check lets through some text no JSON parser takes (e.g. {"a":1e}): shown as it is.
        with contextlib.suppress(ValueError):
            row["headers"] = json.loads(row["headers"])
        # No lease is shown as PostgreSQL shows it, as nulls (the columns hold '' and NO_LEASE: migration 0007).
        if row["lease_expires_at"] == NO_LEASE.replace(tzinfo=UTC):
            row["lease_expires_at"] = None
        row["lease_owner"] = row["lease_owner"] or None
        # The relay writes UUIDs, as PostgreSQL's column type holds them; plain SQL may write any text.
        if not row["claim_token"]:
            row["claim_token"] = None
        else:
            with contextlib.suppress(ValueError):
                row["claim_token"] = UUID(row["claim_token"])
        return row

    async def purge(
        self,
        older_than_seconds: float,
        *,
        dry_run: bool = False,
        batch_size: int = batches.ADMIN_BATCH_SIZE,
        progress: batches.Progress | None = None,
    ) -> int:
        """Delete sent and skipped events older than the cut-off, a small batch at a time."""
        if dry_run:
            select = self._select("purge_select", {"older_us": micros(older_than_seconds)})
            return len(await batches.walk(select, None, batch_size=batch_size, progress=progress))
        total = 0
        while True:
            deleted = await self._db.run("purge_batch", {"older_us": micros(older_than_seconds), "limit": batch_size})
            total += deleted
            if progress is not None:
                progress(deleted)
            if deleted < batch_size:
                return total

    async def skip(self, event_id: int, *, lease_grace_seconds: float, dry_run: bool = False) -> Skipped:
        """Mark one dead-lettered or waiting event skipped, releasing its key; refuse one that may be in flight."""

        async def work(cur: Any) -> Skipped:
            async def steps() -> Skipped:
                await cur.execute(
                    self._db.queries["skip_select"], {"id": event_id, "grace_us": micros(lease_grace_seconds)}
                )
                found = rows_of(cur, await cur.fetchall())
                if not found or not found[0]["unsent"]:
                    return Skipped.NOT_FOUND
                if found[0]["in_flight"]:
                    return Skipped.IN_FLIGHT
                if dry_run:
                    return Skipped.SKIPPED
                await cur.execute(self._db.queries["skip"], {"id": event_id})
                return Skipped.SKIPPED

            return await transaction(cur, steps)

        return await self._db.call("main", work)
