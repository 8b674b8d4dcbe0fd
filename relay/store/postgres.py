"""The PostgreSQL store: claim, settle and inspect the outbox with psycopg 3."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any
from uuid import uuid4

import psycopg
from psycopg import sql

from relay.config import CONNECT_TIMEOUT_SECONDS, TableName, redact_url
from relay.errors import SchemaError, StoreError, StoreReadOnly, StoreUnavailable
from relay.events import Event
from relay.secrets import Scrubber, one_line, secrets_in
from relay.store import sql as named
from relay.store.base import Claim, Dead, DeadEvent, RequeueFilter, Retry, Settlement, Status
from relay.store.floor import FULL_SCAN_INTERVAL_SECONDS, ClaimFloor

logger = logging.getLogger(__name__)

STATEMENT_TIMEOUT_SECONDS = 30.0
# A relay never sits in an open transaction; if one is left open (a stalled
# process), the server ends it instead of holding back vacuum.
IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = 60.0
TCP_USER_TIMEOUT_SECONDS = 30.0
# The server ends a slow statement, and the kernel a connection whose packets
# go unacknowledged; neither ends a call whose peer acknowledges everything
# and answers nothing (a frozen server, a stuck proxy or pooler). This does.
CALL_MARGIN_SECONDS = 5.0
PURGE_BATCH_SIZE = 1000
# The gauges count exactly up to this many unsent events (a bounded read of
# the claim index, 10 to 20 ms here) and estimate past it: see the gauges query.
GAUGES_EXACT_UP_TO = 20_000


def connect_kwargs(
    *, connect_timeout: float = CONNECT_TIMEOUT_SECONDS, statement_timeout: float = STATEMENT_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """Connection settings every relay connection uses: bounded waits everywhere."""
    return {
        "autocommit": True,
        "connect_timeout": max(1, round(connect_timeout)),
        "application_name": "outbox-relay",
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": int(TCP_USER_TIMEOUT_SECONDS * 1000),
        # A commit lost in a database crash costs a duplicate, never a loss: a
        # lost claim leaves the event pending, a lost settle leaves it leased
        # until the lease ends. So the relay does not wait for the WAL flush.
        "options": (
            "-c synchronous_commit=off"
            f" -c statement_timeout={int(statement_timeout * 1000)}"
            f" -c idle_in_transaction_session_timeout={int(IDLE_IN_TRANSACTION_TIMEOUT_SECONDS * 1000)}"
        ),
    }


def password_of(dsn: str) -> str | None:
    """The password in ``dsn``, so that error messages can be scrubbed of it."""
    return next(iter(secrets_in(dsn)), None)


@contextlib.contextmanager
def translate_errors(dsn: str, table: TableName) -> Iterator[None]:
    """Turn psycopg exceptions into the relay's hierarchy, without secrets."""
    try:
        yield
    except psycopg.errors.UndefinedTable:
        raise SchemaError(f"table {table} does not exist: run `outbox-relay migrate` first") from None
    except psycopg.errors.UndefinedColumn as exc:
        raise SchemaError(
            f"table {table} is not an outbox table or is out of date ({exc.diag.message_primary})"
        ) from None
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(describe(exc, dsn)) from exc
    except psycopg.errors.ReadOnlySqlTransaction:
        # A failover's old primary, or a database made read-only for maintenance:
        # unavailable, so the relay waits for writes instead of stopping.
        raise StoreReadOnly(
            "the database is read-only (a hot standby, or default_transaction_read_only is on): writes need the primary"
        ) from None
    except psycopg.Error as exc:
        raise StoreError(describe(exc, dsn)) from exc


def _id_array(ids: Iterable[int]) -> str:
    """Event ids as one PostgreSQL array literal, for ``%(ids)s::bigint[]``.

    psycopg adapts a list item by item in Python; a batch's thousand ids cost
    about a millisecond that way, as one string a tenth of that.
    """
    return "{" + ",".join(map(str, ids)) + "}"


def describe(exc: BaseException, dsn: str) -> str:
    """A one-line description of a database error with any password removed."""
    return one_line(str(exc).replace(dsn, redact_url(dsn)), Scrubber.of(dsn)) or type(exc).__name__


class PostgresStore:
    """The outbox table in PostgreSQL, reached through one connection for
    claims and settles and one for LISTEN."""

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
        full_scan_interval: float = FULL_SCAN_INTERVAL_SECONDS,
    ) -> None:
        self._dsn = dsn
        self._table = table
        self._owner = owner
        self._lease_seconds = lease_seconds
        self._keep_sent = keep_sent
        self._listen_enabled = listen
        self._connect_timeout = connect_timeout
        self._statement_timeout = STATEMENT_TIMEOUT_SECONDS
        self._call_timeout = self._statement_timeout + CALL_MARGIN_SECONDS
        self._conn: psycopg.AsyncConnection[Any] | None = None
        # Settles run on their own connection so that the database works on the
        # next claim while it deletes the last batch.
        self._settle_conn: psycopg.AsyncConnection[Any] | None = None
        # Counting pending rows is a pass over them: keep it off the claim path.
        self._stats_conn: psycopg.AsyncConnection[Any] | None = None
        self._listen_conn: psycopg.AsyncConnection[Any] | None = None
        self._queries = {name: named.render(text, table) for name, text in named.queries().items()}
        # Where claims start scanning the claim index (see relay/store/floor.py).
        self._floor = ClaimFloor(full_scan_interval)
        # The table as regclass input: the gauges read its statistics.
        self._regclass = ".".join(f'"{part}"' for part in table.parts)

    def __repr__(self) -> str:
        return f"PostgresStore({redact_url(self._dsn)!r}, table={str(self._table)!r})"

    @property
    def table(self) -> TableName:
        """The outbox table this store works on."""
        return self._table

    async def open(self) -> None:
        """Connect, check the table, and LISTEN if enabled."""
        await self._connection()
        if self._listen_enabled:
            await self._listener()

    async def close(self) -> None:
        """Close both connections. Safe to call twice."""
        for conn in (self._conn, self._settle_conn, self._stats_conn, self._listen_conn):
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
        self._conn = self._settle_conn = self._stats_conn = self._listen_conn = None

    @contextlib.contextmanager
    def _errors(self, conn: psycopg.AsyncConnection[Any] | None = None) -> Iterator[None]:
        try:
            with translate_errors(self._dsn, self._table):
                yield
        except StoreReadOnly:
            # A session can stay read-only after the database takes writes again
            # (ALTER DATABASE ... SET default_transaction_read_only): hang up, so
            # that the next call reconnects. Its statement has just failed: idle.
            if conn is not None:
                conn.pgconn.finish()
            self._drop_broken()
            raise
        except StoreUnavailable:
            self._drop_broken()
            raise

    def _drop_broken(self) -> None:
        # A broken connection is replaced on the next call; one that only saw
        # a statement timeout is still good and is kept.
        if self._conn is not None and (self._conn.closed or self._conn.broken):
            self._conn = None
        if self._settle_conn is not None and (self._settle_conn.closed or self._settle_conn.broken):
            self._settle_conn = None
        if self._stats_conn is not None and (self._stats_conn.closed or self._stats_conn.broken):
            self._stats_conn = None
        if self._listen_conn is not None and (self._listen_conn.closed or self._listen_conn.broken):
            self._listen_conn = None

    @contextlib.asynccontextmanager
    async def _deadline(self) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(self._call_timeout):
                yield
        except TimeoutError:
            # psycopg cancelled the query, or closed the connection if it could not.
            self._drop_broken()
            raise StoreUnavailable(f"the database did not answer within {self._call_timeout:g}s") from None

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        with self._errors():
            return await psycopg.AsyncConnection.connect(
                self._dsn,
                **connect_kwargs(connect_timeout=self._connect_timeout, statement_timeout=self._statement_timeout),
            )

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None:
            conn = await self._connect()
            try:
                with self._errors():
                    await conn.execute(self._queries["check_table"])
            except BaseException:
                await conn.close()
                raise
            self._conn = conn
            logger.info("connected to the database", extra={"action": "db_connected", "table": str(self._table)})
        return self._conn

    async def _statistician(self) -> psycopg.AsyncConnection[Any]:
        if self._stats_conn is None:
            self._stats_conn = await self._spare(lambda: self._stats_conn)
        return self._stats_conn

    async def _settler(self) -> psycopg.AsyncConnection[Any]:
        if self._settle_conn is None:
            self._settle_conn = await self._spare(lambda: self._settle_conn)
        return self._settle_conn

    async def _spare(self, current: Callable[[], psycopg.AsyncConnection[Any] | None]) -> psycopg.AsyncConnection[Any]:
        """Connect a side connection; if another task connected it meanwhile, keep theirs."""
        conn = await self._connect()
        existing = current()
        if existing is not None:
            await conn.close()
            return existing
        return conn

    async def _listener(self) -> psycopg.AsyncConnection[Any]:
        if self._listen_conn is None:
            conn = await self._connect()
            try:
                with self._errors():
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._table.channel)))
            except BaseException:
                # Also when cancelled: the loop stops waiting for a NOTIFY after the poll interval.
                await conn.close()
                raise
            self._listen_conn = conn
        return self._listen_conn

    async def _fetch(self, name: str, params: dict[str, Any], *, stats: bool = False) -> list[tuple[Any, ...]]:
        async with self._deadline():
            conn = await (self._statistician() if stats else self._connection())
            with self._errors(conn):
                cur = await conn.execute(self._queries[name], params)
                return await cur.fetchall() if cur.description else []

    async def _run(self, name: str, params: dict[str, Any], *, settle: bool = False) -> int:
        async with self._deadline():
            conn = await (self._settler() if settle else self._connection())
            with self._errors(conn):
                cur = await conn.execute(self._queries[name], params)
                return cur.rowcount

    async def claim(self, limit: int, *, max_attempts: int, max_bytes: int | None = None) -> Claim:
        """Lease up to ``limit`` due events (one per key), ordered by priority then id."""
        del max_bytes  # H3a implements the byte cap in the claim statement
        token = uuid4()
        after = self._floor.next_after()
        params = {
            "after": after,
            "limit": limit,
            "max_attempts": max_attempts,
            "token": token,
            "owner": self._owner,
            "lease_seconds": self._lease_seconds,
        }
        # A hinted claim enters the index at the floor for each priority seen (claim_hinted);
        # a full scan, or one past too many priorities, reads it from the start (claim).
        priorities = self._floor.priorities() if after else None
        if priorities is not None:
            params["priorities"] = priorities
        started = time.perf_counter()
        rows = await self._fetch("claim" if priorities is None else "claim_hinted", params)
        self._floor.claimed(
            token,
            [r[0] for r in rows],
            after=after,
            took=time.perf_counter() - started,
            xids=(rows[0][10], rows[0][11]) if rows else None,
            priorities={r[8] for r in rows},
        )
        rows.sort(key=lambda r: (-r[8], r[0]))
        events = [
            Event(
                id=r[0],
                topic=r[1],
                key=r[2],
                payload=r[3].encode(),
                headers=json.loads(r[4]) if r[4] else {},
                idempotency_key=r[5],
                attempts=r[6],
                created_at=r[7],
            )
            for r in rows
        ]
        return Claim(token=token, events=events, reaped=sum(1 for r in rows if r[9]))

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        """Delete (or mark sent) the acknowledged events, reschedule or dead-letter the rest."""
        self._floor.finished(claim.token)
        done = retried = buried = 0
        if sent:
            done = await self._run(
                "ack_keep" if self._keep_sent else "ack_delete",
                {"ids": _id_array(sent), "token": claim.token},
                settle=True,
            )
        if retry:
            retried = await self._run(
                "retry",
                {
                    "ids": [r.id for r in retry],
                    "delays": [r.delay_seconds for r in retry],
                    "errors": [r.error for r in retry],
                    "token": claim.token,
                },
                settle=True,
            )
        if dead:
            buried = await self._run(
                "dead_letter",
                {"ids": [d.id for d in dead], "errors": [d.error for d in dead], "token": claim.token},
                settle=True,
            )
        lost = len(sent) + len(retry) + len(dead) - done - retried - buried
        return Settlement(sent=done, retried=retried, dead=buried, lost=lost)

    async def release(self, claim: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Give unpublished events back without counting the attempt, due again after ``delay_seconds``."""
        self._floor.finished(claim.token)
        if ids:
            await self._run(
                "release", {"ids": _id_array(ids), "token": claim.token, "delay": delay_seconds}, settle=True
            )

    async def reap(self, *, max_attempts: int) -> int:
        """Dead-letter events whose expired lease used their last attempt."""
        return len(await self._fetch("reap_exhausted", {"max_attempts": max_attempts}))

    async def wait(self, timeout: float) -> bool:
        """Wait for a NOTIFY on the table's channel, at most ``timeout`` seconds."""
        if not self._listen_enabled:
            # Polling only: the wait is the poll interval. Returning at once
            # would have the relay claim back to back, an empty claim a
            # millisecond, which slowed the whole database under load.
            await asyncio.sleep(timeout)
            return False
        conn = await self._listener()
        with self._errors():
            async for _ in conn.notifies(timeout=timeout, stop_after=1):
                return True
        return False

    async def status(self) -> Status:
        """Counts of pending, in-flight and dead-lettered events."""
        row = (await self._fetch("status", {}, stats=True))[0]
        return Status(
            pending=row[0],
            in_flight=row[1],
            failed=row[2],
            oldest_pending_age_seconds=await self.oldest_pending_age(),
            parked_keys=row[3],
        )

    async def gauges(self, *, exact_up_to: int = GAUGES_EXACT_UP_TO) -> Status:
        """``status`` at a bounded cost: exact up to ``exact_up_to`` unsent events, estimated past it."""
        params = {"exact_up_to": exact_up_to, "table_name": self._regclass}
        unsent, in_flight, failed, parked_keys, estimate = (await self._fetch("gauges", params, stats=True))[0]
        if unsent > exact_up_to:
            unsent = max(unsent, estimate)
        return Status(
            pending=unsent - in_flight,
            in_flight=in_flight,
            failed=failed,
            oldest_pending_age_seconds=await self.oldest_pending_age(),
            parked_keys=parked_keys,
        )

    async def oldest_pending_age(self) -> float:
        """Seconds since the oldest due event that no live lease holds was written (index probes)."""
        return float((await self._fetch("oldest_pending_age", {}, stats=True))[0][0])

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the database answers, has the table and takes writes."""
        await self._fetch("check_writable", {})  # read-only: StoreReadOnly, hung up as after a claim

    async def dead(self, limit: int = 1000) -> list[DeadEvent]:
        """Dead-lettered events, oldest first."""
        return [DeadEvent(*row) for row in await self._fetch("dead", {"limit": limit})]

    async def requeue(self, selection: RequeueFilter) -> list[int]:
        """Put matching dead-lettered events back to pending with their attempts reset."""
        params = {"id": selection.id, "topic": selection.topic, "key": selection.key}
        return [row[0] for row in await self._fetch("requeue", params)]

    async def inspect(self, event_id: int) -> dict[str, Any] | None:
        """Every column of one event, or None."""
        conn = await self._connection()
        with self._errors():
            cur = await conn.execute(self._queries["inspect"], {"id": event_id})
            row = await cur.fetchone()
            if row is None or cur.description is None:
                return None
            return {col.name: value for col, value in zip(cur.description, row, strict=True)}

    async def purge(self, older_than_seconds: float, *, batch_size: int = PURGE_BATCH_SIZE) -> int:
        """Delete sent and skipped events older than the cut-off, a small batch at a time."""
        total = 0
        while True:
            deleted = await self._run("purge_batch", {"older_than": older_than_seconds, "limit": batch_size})
            total += deleted
            if deleted < batch_size:
                return total

    async def replay(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        key: str | None = None,
        topic: str | None = None,
    ) -> list[int]:
        """Put kept, already-sent events back to pending; returns their ids."""
        params = {"since": since, "until": until, "key": key, "topic": topic}
        return [row[0] for row in await self._fetch("replay", params)]

    async def skip(self, event_id: int) -> bool:
        """Mark one dead-lettered or waiting event skipped, releasing its key."""
        return bool(await self._fetch("skip", {"id": event_id}))
