"""The operator's commands on PostgreSQL: status, dead letters, requeue, skip, inspect, purge, replay."""

from __future__ import annotations

from typing import Any

from psycopg.rows import class_row, dict_row

from relay.config import CONNECT_TIMEOUT_SECONDS, NATIVE, TableLayout, TableName, redact_url
from relay.store.base import DeadEvent, ReplayFilter, RequeueFilter, RetryFilter, Skipped, Status, undecodable
from relay.store.postgres import monitoring
from relay.store.postgres.connection import Database, column_of

PURGE_BATCH_SIZE = 1000


class PostgresAdmin:
    """The outbox table as operators see it (the ``Admin`` port): what the CLI's commands call."""

    def __init__(
        self,
        dsn: str,
        table: TableName,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        statement_timeout: float | None = None,
        layout: TableLayout = NATIVE,
        columns_in_headers: bool = True,
    ) -> None:
        self._db = Database(
            dsn,
            table,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            layout=layout,
            columns_in_headers=columns_in_headers,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self._db.dsn)!r}, table={str(self._db.table)!r})"

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
        """Counts of pending, in-flight, retrying and dead-lettered events; with ``topics``, per topic."""
        return await monitoring.status(self._db, topics=topics)

    async def dead(self, limit: int = 1000, *, topic: str | None = None) -> list[DeadEvent]:
        """Dead-lettered events, oldest first; with ``topic``, of that topic only."""
        if undecodable(topic):
            return []  # as in requeue
        params = {"limit": limit, "topic": topic}
        return await self._db.fetch("dead", params, class_row(DeadEvent), any_time=True)

    async def requeue(self, selection: RequeueFilter) -> list[int]:
        """Put matching dead-lettered events back to pending with their attempts reset."""
        if undecodable(selection.topic) or undecodable(selection.key):
            return []  # bytes that are not UTF-8 (a command-line argument): no text column holds them
        params = {"id": selection.id, "topic": selection.topic, "key": selection.key, "all": selection.all}
        return sorted(await self._db.fetch("requeue", params, column_of("id", int)))

    async def retry_now(self, selection: RetryFilter) -> list[int]:
        """Make matching retrying events due now, attempts kept; their ids."""
        if undecodable(selection.topic):
            return []  # as in requeue
        params = {"id": selection.id, "topic": selection.topic, "all": selection.all}
        return sorted(await self._db.fetch("retry_now", params, column_of("id", int)))

    async def inspect(self, event_id: int) -> dict[str, Any] | None:
        """Every column of one event, or None."""
        rows = await self._db.fetch("inspect", {"id": event_id}, dict_row, any_time=True)
        return rows[0] if rows else None

    async def purge(self, older_than_seconds: float, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete sent and skipped events older than the cut-off, a small batch at a time."""
        total = 0
        while True:
            deleted = await self._db.run("purge_batch", {"older_than": older_than_seconds, "limit": batch_size})
            total += deleted
            if deleted < batch_size:
                return total

    async def replay(self, selection: ReplayFilter) -> list[int]:
        """Put kept, already-sent events back to pending; returns their ids."""
        if undecodable(selection.topic) or undecodable(selection.key):
            return []  # as in requeue
        params = {
            "since": selection.since,
            "until": selection.until,
            "key": selection.key,
            "topic": selection.topic,
            "all": selection.all,
        }
        return sorted(await self._db.fetch("replay", params, column_of("id", int)))

    async def skip(self, event_id: int, *, lease_grace_seconds: float) -> Skipped:
        """Mark one dead-lettered or waiting event skipped, releasing its key; refuse one that may be in flight."""
        params = {"id": event_id, "grace": lease_grace_seconds}
        return Skipped((await self._db.fetch("skip", params, column_of("outcome", str)))[0])
