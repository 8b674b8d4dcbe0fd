"""The operator's commands on PostgreSQL: status, dead letters, requeue, skip, inspect, purge, replay."""

from __future__ import annotations

from typing import Any

from psycopg.rows import class_row, dict_row

from relay.config import CONNECT_TIMEOUT_SECONDS, NATIVE, TableLayout, TableName, redact_url
from relay.store import batches
from relay.store.base import DeadEvent, ReplayFilter, RequeueFilter, RetryFilter, Skipped, Status, undecodable
from relay.store.postgres import monitoring
from relay.store.postgres.connection import Database, column_of, id_array

#: Purge's batch: the one every operator's command takes (kept under its old name).
PURGE_BATCH_SIZE = batches.ADMIN_BATCH_SIZE


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

    def _select(self, name: str, params: dict[str, Any]) -> batches.Select:
        """The next batch of the selection query ``name`` takes."""

        async def select(after: int | None, limit: int) -> list[int]:
            return await self._db.fetch(name, {**params, "after": after, "limit": limit}, column_of("id", int))

        return select

    def _change(self, name: str) -> batches.Change:
        """Statement ``name`` on one batch's ids (it checks each still matches); the ids it changed."""

        async def change(ids: list[int]) -> list[int]:
            return sorted(await self._db.fetch(name, {"ids": id_array(ids)}, column_of("id", int)))

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
        if undecodable(selection.topic) or undecodable(selection.key):
            return []  # bytes that are not UTF-8 (a command-line argument): no text column holds them
        params = {"id": selection.id, "topic": selection.topic, "key": selection.key, "all": selection.all}
        return await batches.walk(
            self._select("requeue_select", params),
            None if dry_run else self._change("requeue"),
            batch_size=batch_size,
            progress=progress,
        )

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
            select = self._select("purge_select", {"older_than": older_than_seconds})
            return len(await batches.walk(select, None, batch_size=batch_size, progress=progress))
        total = 0
        while True:
            deleted = await self._db.run("purge_batch", {"older_than": older_than_seconds, "limit": batch_size})
            total += deleted
            if progress is not None:
                progress(deleted)
            if deleted < batch_size:
                return total

    async def replay(
        self,
        selection: ReplayFilter,
        *,
        dry_run: bool = False,
        batch_size: int = batches.ADMIN_BATCH_SIZE,
        progress: batches.Progress | None = None,
    ) -> list[int]:
        """Put kept, already-sent events back to pending, a batch at a time; returns their ids."""
        if undecodable(selection.topic) or undecodable(selection.key):
            return []  # as in requeue
        params = {
            "since": selection.since,
            "until": selection.until,
            "key": selection.key,
            "topic": selection.topic,
            "all": selection.all,
        }
        return await batches.walk(
            self._select("replay_select", params),
            None if dry_run else self._change("replay"),
            batch_size=batch_size,
            progress=progress,
        )

    async def skip(self, event_id: int, *, lease_grace_seconds: float, dry_run: bool = False) -> Skipped:
        """Mark one dead-lettered or waiting event skipped, releasing its key; refuse one that may be in flight."""
        params = {"id": event_id, "grace": lease_grace_seconds}
        if dry_run:
            found = await self._db.fetch("skip_check", params, column_of("outcome", str))
            return Skipped(found[0]) if found else Skipped.NOT_FOUND
        return Skipped((await self._db.fetch("skip", params, column_of("outcome", str)))[0])
