"""The slot's status, the leader's lock, and the relay's few writes to the outbox table.

- :func:`.publication.prepare` (``migrate --source log --slot NAME``) makes the
  publication and the slot; its names are kept here for the callers of old.
- :class:`TableLink`: one ordinary connection per relay. It holds the leader's
  session advisory lock (keyed by the slot's name; ``idle_session_timeout`` ends
  the session, and the lock, of a reader frozen longer than the bound), checks
  it before each confirm (fencing), and writes what the relay writes: dead
  letters, events parked behind one, and the deletion of delivered rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from relay.config import NATIVE, TableLayout, TableName
from relay.errors import StoreError, StoreUnavailable
from relay.events import Event
from relay.sources.log import debezium
from relay.sources.log.publication import check_slot_name
from relay.store.debezium import identifiers
from relay.store.postgres.store import debezium_headers


def lock_key(slot: str) -> int:
    """The session advisory lock a slot's reader holds: a stable 63-bit key from the slot's name."""
    digest = hashlib.sha256(f"outbox-relay slot {slot}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def slot_status(dsn: str, slot: str) -> dict[str, object]:
    """What ``status --slot`` shows: whether the slot exists, its lag in bytes, ``wal_status``, reader."""
    check_slot_name(slot)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT slot_name, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, wal_status,"
                " active_pid, confirmed_flush_lsn::text, safe_wal_size FROM pg_replication_slots WHERE slot_name = %s",
                [slot],
            ).fetchone()
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach the database: {exc}") from None
    if row is None:
        return {"name": slot, "exists": False}
    return {
        "name": slot, "exists": True, "lag_bytes": row[1], "wal_status": row[2], "reader_pid": row[3],
        "confirmed_lsn": row[4], "safe_wal_size": row[5],
    }  # fmt: skip


_UPSERT = """
INSERT INTO {table} (id, topic, key, payload, payload_bytes, content_type, headers, idempotency_key, created_at,
                     state, attempts, last_error, failed_at)
VALUES (%(id)s, %(topic)s, %(key)s, %(payload)s::jsonb, %(payload_bytes)s, %(content_type)s, %(headers)s::jsonb,
        %(idempotency_key)s, %(created_at)s, %(state)s, %(attempts)s, %(last_error)s,
        CASE WHEN %(state)s = 'failed' THEN now() END)
ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, attempts = EXCLUDED.attempts,
    last_error = EXCLUDED.last_error, failed_at = EXCLUDED.failed_at,
    lease_expires_at = NULL, claim_token = NULL, lease_owner = NULL
"""


_INSERT = """
INSERT INTO {table} (topic, key, payload, payload_bytes, content_type, headers, idempotency_key, created_at,
                     state, attempts, last_error, failed_at)
VALUES (%(topic)s, %(key)s, %(payload)s::jsonb, %(payload_bytes)s, %(content_type)s, %(headers)s::jsonb,
        %(idempotency_key)s, %(created_at)s, %(state)s, %(attempts)s, %(last_error)s,
        CASE WHEN %(state)s = 'failed' THEN now() END)
ON CONFLICT (idempotency_key) DO NOTHING
"""

#: The fencing check and the deletion of delivered rows, in one statement: the rows go only while this
#: session holds the slot's lock.
_FENCE_AND_DELETE = """
WITH lead AS (
    SELECT count(*) AS held FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted
      AND classid = %(classid)s::bigint::oid AND objid = %(objid)s::bigint::oid AND objsubid = 1
), gone AS (
    DELETE FROM {table}
    WHERE id = ANY(%(ids)s::bigint[]) AND state = 'pending' AND last_error IS NULL
      AND (SELECT held FROM lead) > 0
)
SELECT held FROM lead
"""

#: The rows handed over to the table that may go now: in id order, each key's from its first on, while every
#: earlier handed-over row of its key still there (pending or dead-lettered: skipped ones no longer hold it)
#: is due and pending, so goes before it in this order (a run of the key: a backlog handed over by migrate has
#: thousands of events of a key, and one a round would send one a sweep).
_HANDED_OVER = """
SELECT id, topic, key, payload::text, payload_bytes, content_type, headers::text, idempotency_key, attempts,
       created_at
FROM {table} o
WHERE state = 'pending' AND last_error IS NOT NULL AND deliver_at <= now()
  AND (key IS NULL OR NOT EXISTS (
      SELECT 1 FROM {table} e
      WHERE e.key = o.key AND e.id < o.id AND e.state IN ('pending', 'failed') AND e.last_error IS NOT NULL
        AND NOT (e.state = 'pending' AND e.deliver_at <= now())))
ORDER BY id
LIMIT %(limit)s
"""


def _refused(exc: psycopg.Error, doing: str) -> StoreError:
    """A statement the server refused for good (no wait mends it), in one line that says what to do."""
    why = exc.diag.message_primary or type(exc).__name__
    hint = ""
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        hint = (
            "; grant the relay's role what `outbox-relay migrate --create-roles --source log` grants it, then"
            " start the relay again (nothing past this event was confirmed: it is read again)"
        )
    return StoreError(f"{doing}: {why} (SQLSTATE {exc.sqlstate}){hint}")


class TableLink:
    """The relay's ordinary connection: the leader's lock, fencing, and its writes to the outbox table."""

    def __init__(
        self, dsn: str, table: TableName, slot: str, *, leader_timeout_seconds: float, layout: TableLayout = NATIVE
    ) -> None:
        self._dsn = dsn
        self._table = table
        self._slot = slot
        self._key = lock_key(slot)
        self._timeout = leader_timeout_seconds
        self._conn: psycopg.AsyncConnection[Any] | None = None
        # One statement or transaction at a time: the confirm runs beside the deliverer's writes, and a
        # statement of one must never land inside the other's transaction.
        self._turn = asyncio.Lock()
        self._layout = layout
        # Debezium's table is read and written through its view, which has the native column names.
        self._target = sql.Identifier(*layout.relation(table).parts)
        # A frozen leader's session ends, and its lock with it, after this long idle: in a transaction too (a
        # park's DELETE and INSERT), where idle_session_timeout does not count.
        idle = int(self._timeout * 1000)
        self._options = (
            f"-c idle_session_timeout={idle} -c idle_in_transaction_session_timeout={idle} -c statement_timeout=30000"
        )
        if layout.debezium:
            # The template is validated (letters, digits, ._- and braces): nothing to escape.
            self._options += f" -c outbox_relay.topic_template={layout.topic_template}"
            self._options += " -c outbox_relay.columns_in_headers=on"

    async def connect(self, connect_timeout: float) -> None:
        await self.close()
        try:
            self._conn = await psycopg.AsyncConnection.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(1, round(connect_timeout)),
                options=self._options,
            )
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot reach the database: {exc}") from None

    @property
    def connected(self) -> bool:
        """Whether the connection is open (closed after it was lost, and with it the lock)."""
        return self._conn is not None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a connection that may be gone
                await conn.close()

    async def _run(self, query: Any, params: Any = None, *, doing: str = "a query failed") -> list[tuple[Any, ...]]:
        async with self._turn:
            return await self._run_now(query, params, doing)

    async def _run_now(self, query: Any, params: Any, doing: str) -> list[tuple[Any, ...]]:
        if self._conn is None:
            raise StoreUnavailable("not connected")
        try:
            cursor = await self._conn.execute(query, params)
            return await cursor.fetchall() if cursor.description else []
        except psycopg.OperationalError as exc:
            await self.close()
            raise StoreUnavailable(f"database connection lost: {exc}") from None
        except psycopg.Error as exc:
            raise _refused(exc, doing) from None

    async def check(self) -> None:
        await self._run("SELECT 1")

    async def try_lead(self) -> bool:
        """Take the slot's lock if no other relay holds it."""
        rows = await self._run("SELECT pg_try_advisory_lock(%s)", [self._key])
        return bool(rows[0][0])

    async def fence_and_delete(self, ids: Sequence[int]) -> bool:
        """Whether this session still holds the slot's lock and, if it does, delete the rows of acknowledged
        table events ``ids`` (the WAL keeps their INSERT: a re-read loses nothing), in one round trip.

        The ids go as one text array literal, which the server parses: psycopg's dump of a list of ints
        cost the relay more CPU per event than reading the event from the stream.
        """
        rows = await self._run(
            sql.SQL(_FENCE_AND_DELETE).format(table=self._target),
            {"classid": self._key >> 32, "objid": self._key & 0xFFFFFFFF,
             "ids": "{" + ",".join(map(str, ids)) + "}"},
        )  # fmt: skip
        return bool(rows[0][0])

    async def end_stale_reader(self) -> None:
        """End the walsender still holding the slot for a reader that lost the lock (frozen, cut off)."""
        await self._run(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
            " WHERE slot_name = %s AND active_pid IS NOT NULL",
            [self._slot],
        )

    async def slot(self) -> tuple[int | None, str | None, float | None] | None:
        """The slot's lag in bytes, its ``wal_status``; None when it is gone."""
        rows = await self._run(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, wal_status"
            " FROM pg_replication_slots WHERE slot_name = %s",
            [self._slot],
        )
        if not rows:
            return None
        return rows[0][0], rows[0][1], None

    async def heartbeat(self) -> None:
        """A non-transactional message, so the stream goes on (and the slot advances) on an idle database."""
        await self._run("SELECT pg_logical_emit_message(false, 'outbox-heartbeat', '')")

    async def parked_keys(self) -> set[str]:
        """Keys the table holds back: those with a dead letter, or events handed over to it."""
        rows = await self._run(
            sql.SQL(
                "SELECT DISTINCT key FROM {} WHERE key IS NOT NULL AND state IN ('pending', 'failed')"
                " AND last_error IS NOT NULL"
            ).format(self._target)
        )
        return {row[0] for row in rows}

    async def write(self, event: Event, *, row: bool, state: str, reason: str, attempts: int) -> None:
        """Write ``event`` into the table: a dead letter (``failed``), or ``pending`` parked behind one.

        A table event's dead letter is its own row. Any other event becomes a new row, its id from the
        table's sequence, so that a key's rows are in the order the log gave them: a parked table event's
        row is replaced by one (its idempotency key keeps a re-read after a crash from writing it twice).
        """
        params = {
            "id": event.id,
            "topic": event.topic or "(none)",
            "key": event.key,
            "payload": event.payload.decode() if event.content_type is None else None,
            "payload_bytes": None if event.content_type is None else event.payload,
            "content_type": event.content_type,
            "headers": Jsonb(event.headers),
            "idempotency_key": event.idempotency_key,
            "created_at": event.created_at,
            "state": state,
            "attempts": attempts,
            "last_error": reason,
        }
        what = "dead letter" if state == "failed" else "event parked behind a dead letter"
        doing = f"cannot write event {event.id} into the outbox table {self._table} (a {what})"
        if self._layout.debezium:
            # Only the table's rows are read on this layout: each is written in place (relay.sources.log.debezium).
            query = debezium.DEAD_LETTER if state == "failed" else debezium.PARK
            await self._run(sql.SQL(query).format(view=self._target, seq_name=identifiers(self._table)["seq_name"]),
                            params, doing=doing)  # fmt: skip
            return
        if row and state == "failed":
            await self._run(sql.SQL(_UPSERT).format(table=self._target), params, doing=doing)
            return
        async with self._turn:
            await self._replace_row(params, row=row, doing=doing)

    async def _replace_row(self, params: dict[str, Any], *, row: bool, doing: str) -> None:
        if self._conn is None:
            raise StoreUnavailable("not connected")
        try:
            async with self._conn.transaction():
                if row:
                    await self._conn.execute(
                        sql.SQL("DELETE FROM {} WHERE id = %(id)s AND state = 'pending' AND last_error IS NULL").format(
                            self._target
                        ),
                        params,
                    )
                await self._conn.execute(sql.SQL(_INSERT).format(table=self._target), params)
        except psycopg.OperationalError as exc:
            await self.close()
            raise StoreUnavailable(f"database connection lost: {exc}") from None
        except psycopg.Error as exc:
            raise _refused(exc, doing) from None

    async def handed_over(self, limit: int) -> list[tuple[Any, ...]]:
        """Due rows handed over to the table (parked, or requeued dead letters) that go next, by id: each key's
        from its first still there (not skipped) on, while they are due and pending."""
        return await self._run(sql.SQL(_HANDED_OVER).format(table=self._target), {"limit": limit})

    def headers(self, row_headers: str | None, idempotency_key: str) -> dict[str, str]:
        """A handed-over row's message headers: its own, or on Debezium's layout the ``id`` and field headers."""
        found = json.loads(row_headers) if row_headers else {}
        if self._layout.debezium:
            return debezium_headers(found, idempotency_key, self._layout.field_headers)
        return found

    async def settle_handed_over(self, sent: Sequence[int], retry: Sequence[tuple[int, float, str]],
                                 dead: Sequence[tuple[int, str]]) -> None:  # fmt: skip
        """Delete the acknowledged handed-over rows; the failed ones due later, or dead-lettered."""
        if sent:
            await self._run(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(self._target), [list(sent)])
        for event_id, delay, error in retry:
            await self._run(
                sql.SQL(
                    "UPDATE {} SET attempts = attempts + 1, last_error = %s,"
                    " deliver_at = now() + make_interval(secs => %s) WHERE id = %s"
                ).format(self._target),
                [error, delay, event_id],
            )
        for event_id, error in dead:
            await self._run(
                sql.SQL(
                    "UPDATE {} SET state = 'failed', attempts = attempts + 1, last_error = %s, failed_at = now()"
                    " WHERE id = %s"
                ).format(self._target),
                [error, event_id],
            )
