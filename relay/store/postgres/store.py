"""The relay's hot path on PostgreSQL: claim, settle, release, reap, and wait for new events."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple
from uuid import UUID, uuid4

import psycopg
from psycopg.rows import RowMaker

from relay.config import CONNECT_TIMEOUT_SECONDS, NATIVE, TableLayout, TableName
from relay.errors import ClaimTimeout, SchemaError, StoreUnavailable
from relay.events import Event
from relay.store import debezium
from relay.store.base import (
    Claim,
    Dead,
    Retry,
    Settlement,
    Started,
    Status,
    chained_keys,
    in_key_order,
    tails_of,
)
from relay.store.floor import FULL_SCAN_AFTER, FULL_SCAN_INTERVAL_SECONDS, ClaimFloor
from relay.store.postgres import monitoring
from relay.store.postgres.admin import PostgresAdmin
from relay.store.postgres.connection import Database, column_index, column_of, id_array

#: ``max_bytes`` when the caller sets no bound: more than any batch can hold.
UNBOUNDED_BYTES = 2**62


class Claimed(NamedTuple):
    """One row of a claim: the event, and what the claim floor and the ordering need."""

    neg_priority: int  # first, so that sorting the rows puts higher priorities first, then lower ids
    id: int
    event: Event
    priority: int
    reaped: bool
    snapshot_xmin: int
    xact_id: int


_CLAIMED_COLUMNS = (
    "id", "topic", "key", "payload", "headers", "idempotency_key", "attempts", "created_at",
    "priority", "reaped", "chained", "snapshot_xmin", "xact_id", "payload_bytes", "content_type",
)  # fmt: skip


def debezium_headers(
    row_headers: dict[str, Any], event_id: str, field_headers: Sequence[tuple[str, str]]
) -> dict[str, str]:
    """A Debezium row's message headers: ``id`` and each ``--field-header`` column that is not null.

    The view's ``headers`` hold the application's columns when a relay asks
    for them (see :mod:`relay.store.debezium`); ``event_id`` is the row's id.
    """
    headers = {"id": event_id}
    for column, header in field_headers:
        value = row_headers.get(column)
        if value is not None:
            headers[header] = value
    return headers


def claimed_row(
    cursor: Any, *, shape_headers: Callable[[dict[str, Any], str], dict[str, str]] | None = None
) -> RowMaker[Claimed]:
    """Claim rows as :class:`Claimed`, each column found by name once per query.

    A claim builds up to ``--batch-size`` events; this builds each one as its
    row is decoded, at the cost of the positional code it replaced (see the
    commit that introduced it for the figures). ``shape_headers`` turns the
    row's headers and its idempotency key into the message's headers (Debezium's layout).
    """
    index = column_index(cursor)
    missing = [name for name in _CLAIMED_COLUMNS if name not in index]
    if missing:
        raise RuntimeError(f"the claim query lacks the columns {missing}")
    (i_id, i_topic, i_key, i_payload, i_headers, i_idem, i_attempts, i_created, i_prio, i_reaped, i_chained, i_xmin,
     i_xid, i_bytes, i_content_type) = (index[name] for name in _CLAIMED_COLUMNS)  # fmt: skip
    loads = json.loads

    def make(values: Sequence[Any]) -> Claimed:
        headers = values[i_headers]
        payload = values[i_payload]
        event = Event(
            id=values[i_id],
            # A Debezium view built before 2026-12-04 gives a null aggregatetype a null topic:
            # empty, as the view now gives it, which the sinks dead-letter.
            topic=values[i_topic] or "",
            key=values[i_key],
            # JSON as text, or (payload NULL) bytes as they are, with their content type.
            payload=payload.encode() if payload is not None else values[i_bytes],
            headers=(loads(headers) if headers else {})
            if shape_headers is None
            else shape_headers(loads(headers) if headers else {}, values[i_idem]),
            idempotency_key=values[i_idem],
            attempts=values[i_attempts],
            created_at=values[i_created],
            chained=values[i_chained],
            content_type=values[i_content_type],
        )
        priority = values[i_prio]
        return Claimed(-priority, values[i_id], event, priority, values[i_reaped], values[i_xmin], values[i_xid])

    return make


class PostgresStore(PostgresAdmin):
    """The outbox table in PostgreSQL (the ``Store`` port, and ``Admin`` for
    retention): claims on one connection, settles on another, and one to LISTEN."""

    def __init__(
        self,
        dsn: str,
        table: TableName,
        *,
        owner: str,
        lease_seconds: float,
        keep_sent: bool = False,
        listen: bool = True,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        statement_timeout: float | None = None,
        full_scan_interval: float = FULL_SCAN_INTERVAL_SECONDS,
        layout: TableLayout = NATIVE,
    ) -> None:
        super().__init__(
            dsn,
            table,
            connect_timeout=connect_timeout,
            statement_timeout=statement_timeout,
            layout=layout,
            # Debezium's application columns only for the --field-header columns.
            columns_in_headers=bool(layout.field_headers),
        )
        self._rows: Any = claimed_row
        if layout.debezium:
            shape = functools.partial(debezium_headers, field_headers=layout.field_headers)
            self._rows = functools.partial(claimed_row, shape_headers=shape)
        self._owner = owner
        self._lease_seconds = lease_seconds
        self._keep_sent = keep_sent
        self._listen_enabled = listen
        # Where claims start scanning the claim index (see relay/store/floor.py).
        self._floor = ClaimFloor(full_scan_interval)

    async def open(self) -> None:
        """Connect, check the table (and the ``--field-header`` columns), and LISTEN if enabled."""
        await self._db.open(listen=self._listen_enabled)
        wanted = {column for column, _ in self._db.layout.field_headers}
        if wanted:
            name = ".".join(f'"{part}"' for part in self.table.parts)
            found = set(await self._db.fetch("table_columns", {"table_name": name}, column_of("name", str)))
            if wanted - found:
                missing = ", ".join(sorted(wanted - found))
                raise SchemaError(f"--field-header: table {self.table} has no column {missing}")
            view = ".".join(f'"{part}"' for part in self._db.layout.relation(self.table).parts)
            read = await self._db.fetch("view_columns", {"table_name": name, "view_name": view}, column_of("name", str))
            unsent = sorted(wanted - debezium.header_columns(read))
            if unsent:
                raise SchemaError(
                    f"--field-header: column {', '.join(unsent)} of table {self.table} is in no header: the payload "
                    f"and the relay_* columns never are, nor columns past the first {debezium.MAX_HEADER_COLUMNS} "
                    "of the table's own or added after the last migrate (run migrate again)"
                )

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        """Lease up to ``limit`` due events (runs of each key's, at least one, their payloads up to
        ``max_bytes``), by priority then id, each key's in id order; see :meth:`Store.claim`."""
        started = await self.start_claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        return await started.events()

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        """:meth:`claim`, returning once the rows are in, before the events are built (decoding a claim of
        thousands of rows takes tens of milliseconds of this process, during which the next claim can run)."""
        token = uuid4()
        after = self._floor.next_after()
        params = {
            # 0 is the floor's full scan: from the least bigint, so that ids written by hand below 0 are seen.
            "after": after if after else FULL_SCAN_AFTER,
            "limit": limit,
            "max_bytes": UNBOUNDED_BYTES if max_bytes is None else max_bytes,
            "max_attempts": max_attempts,
            "token": token,
            "owner": self._owner,
            "lease_seconds": self._lease_seconds,
            **_tails(chain),
        }
        # A hinted claim enters the index at the floor for each priority seen (claim_hinted);
        # a full scan, or one past too many priorities, reads it from the start (claim).
        priorities = self._floor.priorities() if after else None
        if priorities is not None:
            params["priorities"] = priorities
        started = time.perf_counter()
        try:
            cursor = await self._db.execute("claim" if priorities is None else "claim_hinted", params, self._rows)
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, psycopg.errors.QueryCanceled):  # the statement timeout
                raise ClaimTimeout(f"claiming up to {limit} events: {exc}") from exc
            raise
        leased = _Leased(token, cursor, self._db)
        self._floor.claimed(
            token,
            leased.ids,
            after=after,
            took=time.perf_counter() - started,
            xids=leased.xids,
            priorities=leased.priorities,
        )
        return leased

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        """Delete (or mark sent) the acknowledged events, reschedule or dead-letter the rest."""
        self._floor.finished(claim.token)
        done = retried = buried = 0
        if sent:
            done = await self._db.run(
                "ack_keep" if self._keep_sent else "ack_delete",
                {"ids": id_array(sent), "token": claim.token},
                lane="settle",
            )
        if retry:
            retried = await self._db.run(
                "retry",
                {
                    "ids": [r.id for r in retry],
                    "delays": [r.delay_seconds for r in retry],
                    "errors": [r.error for r in retry],
                    "token": claim.token,
                    "taken_over": id_array(claim.taken_over),
                },
                lane="settle",
            )
        if dead:
            buried = await self._db.run(
                "dead_letter",
                {
                    "ids": [d.id for d in dead],
                    "errors": [d.error for d in dead],
                    "token": claim.token,
                    "taken_over": id_array(claim.taken_over),
                },
                lane="settle",
            )
        lost = len(sent) + len(retry) + len(dead) - done - retried - buried
        return Settlement(sent=done, retried=retried, dead=buried, lost=lost)

    async def renew(self, claim: Claim) -> set[int]:
        """Start the lease again for the claim's events it still holds."""
        params = {
            "ids": id_array([e.id for e in claim.events]),
            "token": claim.token,
            "lease_seconds": self._lease_seconds,
        }
        return set(await self._db.fetch("renew", params, column_of("id", int), lane="settle"))

    async def release(self, claim: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Give unpublished events back without counting the attempt, due again after ``delay_seconds``."""
        self._floor.finished(claim.token)
        if ids:
            await self._db.run(
                "release",
                {
                    "ids": id_array(ids),
                    "token": claim.token,
                    "delay": delay_seconds,
                    "taken_over": id_array(claim.taken_over),
                },
                lane="settle",
            )

    async def reap(self, *, max_attempts: int) -> int:
        """Dead-letter events whose expired lease used their last attempt."""
        return len(await self._db.fetch("reap_exhausted", {"max_attempts": max_attempts}, column_of("id", int)))

    async def wait(self, timeout: float) -> bool:
        """Wait for a NOTIFY on the table's channel, at most ``timeout`` seconds."""
        if not self._listen_enabled:
            # Polling only: the wait is the poll interval. Returning at once
            # would have the relay claim back to back, an empty claim a
            # millisecond, which slowed the whole database under load.
            await asyncio.sleep(timeout)
            return False
        async with self._db.deadline():
            conn = await self._db.listener()
        with self._db.errors():
            async for _ in conn.notifies(timeout=timeout, stop_after=1):
                return True
        return False

    async def gauges(self, *, exact_up_to: int = monitoring.GAUGES_EXACT_UP_TO) -> Status:
        """``status`` at a bounded cost: exact up to ``exact_up_to`` unsent events, estimated past it."""
        return await monitoring.gauges(self._db, exact_up_to=exact_up_to)

    async def oldest_pending_age(self) -> float:
        """Seconds since the oldest due event that no live lease holds was written (index probes)."""
        return await monitoring.oldest_pending_age(self._db)

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the database answers, has the table and takes writes."""
        await self._db.run("check_writable", {})  # read-only: StoreReadOnly, hung up as after a claim


class _Leased:
    """A claim's rows as they came: what the floor and the next claim need, read from the raw result
    (a few columns of each row); the events are built when asked for."""

    def __init__(self, token: UUID, cursor: psycopg.AsyncCursor[Claimed], db: Database) -> None:
        self.token = token
        self._cursor = cursor
        self._db = db
        result = cursor.pgresult
        self.rows = result.ntuples if result is not None else 0
        self.ids: list[int] = []
        self.priorities: set[int] = set()
        self.xids: tuple[int, int] | None = None
        self._keyed: list[tuple[int, Any, Any]] = []
        if result is None or not self.rows:
            return
        index = column_index(cursor)
        value = result.get_value
        i_id, i_topic, i_key, i_prio = index["id"], index["topic"], index["key"], index["priority"]
        # As they came: int() reads the digits' bytes; text is decoded only for the tails.
        ids, priorities, keyed = self.ids, set(), []
        for row in range(self.rows):
            event_id = int(value(row, i_id) or 0)
            ids.append(event_id)
            priorities.add(value(row, i_prio))
            if (key := value(row, i_key)) is not None:
                # A Debezium view built before 2026-12-04 gives a null aggregatetype a null topic (see make).
                keyed.append((event_id, value(row, i_topic) or b"", key))
        self.priorities = {int(p or 0) for p in priorities}
        self._keyed = keyed
        self.xids = (int(value(0, index["snapshot_xmin"]) or 0), int(value(0, index["xact_id"]) or 0))

    def tails(self) -> Claim:
        return tails_of(self.token, self._keyed, decode=True)

    async def events(self) -> Claim:
        rows = await self._db.rows(self._cursor)
        # By priority, highest first, then by id (each row starts with (-priority, id)); each key's in id order.
        rows = in_key_order(rows, lambda row: row[:2], event=lambda row: row.event)
        taken_over = frozenset(r.event.id for r in rows if r.reaped)
        return Claim(token=self.token, events=[r.event for r in rows], taken_over=taken_over)


def _tails(chain: Sequence[Claim]) -> dict[str, Any]:
    """The claim's parameters for the batches in flight it may go on from: their keys' last events."""
    tails = chained_keys(chain)
    return {
        "mine": [claim.token for claim in chain],
        "tail_keys": list(tails),
        "tail_ids": [e.id for e in tails.values()],
        "tail_topics": [e.topic for e in tails.values()],
    }
