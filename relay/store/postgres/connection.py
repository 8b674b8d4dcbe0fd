"""Connections to PostgreSQL: their settings, and a deadline on every call (:class:`Database`).

How errors are translated is in :mod:`.errors`, how statements are sent and rows read in
:mod:`.statements`; their names stay importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Literal

import psycopg
from psycopg import sql
from psycopg.rows import AsyncRowFactory

from relay.config import CONNECT_TIMEOUT_SECONDS, NATIVE, TableLayout, TableName
from relay.errors import ConfigError, StoreReadOnly, StoreUnavailable
from relay.store import sql as named
from relay.store.postgres.errors import check_encoding, describe, password_of, translate_errors
from relay.store.postgres.statements import (
    AnyTimeLoader,
    R,
    Statement,
    _has_rows,
    column_index,
    column_of,
    id_array,
)

__all__ = [
    "CALL_MARGIN_SECONDS",
    "IDLE_IN_TRANSACTION_TIMEOUT_SECONDS",
    "STATEMENT_TIMEOUT_SECONDS",
    "TCP_USER_TIMEOUT_SECONDS",
    "AnyTimeLoader",
    "Database",
    "Lane",
    "Statement",
    "check_encoding",
    "column_index",
    "column_of",
    "connect_kwargs",
    "describe",
    "id_array",
    "password_of",
    "translate_errors",
]

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

#: Which connection a statement runs on: claims and admin commands, settles, or statistics.
Lane = Literal["main", "settle", "stats"]


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
        # JIT compiling pays off for long analytical queries, never for the
        # relay's short ones: on a large table a status count spent seconds
        # compiling (its subqueries' cost estimates cross jit_above_cost).
        # Times come back in UTC whatever the server's zone, as the relay logs them and MySQL gives
        # them (a PGTZ the operator sets still wins: libpq sends it after the options). A startup
        # option, not a SET: through a transaction pooler a SET would change another client's session.
        # The formats the relay reads, whatever the database's defaults: psycopg parses times only in
        # the ISO DateStyle (under 'SQL, DMY' a claim leased its rows, then failed to read them: each
        # restart spent an attempt until the events were dead-lettered unsent), and a float8 keeps
        # its digits only with extra_float_digits above 0. The claim is written for READ COMMITTED
        # (FOR UPDATE SKIP LOCKED): under a serializable default it failed and waited out a backoff.
        "options": (
            "-c synchronous_commit=off -c jit=off -c TimeZone=UTC -c DateStyle=ISO -c IntervalStyle=postgres"
            r" -c extra_float_digits=3 -c default_transaction_isolation=read\ committed"
            f" -c statement_timeout={max(1, int(statement_timeout * 1000))}"
            f" -c idle_in_transaction_session_timeout={int(IDLE_IN_TRANSACTION_TIMEOUT_SECONDS * 1000)}"
        ),
    }


class Database:
    """One outbox table's connections: claims and admin commands on one, settles
    on another (the database works on the next claim while it deletes the last
    batch), statistics on a third (counting is a pass over the rows: kept off
    the claim path), and one to LISTEN. Every call runs under a deadline.

    With Debezium's ``layout`` the queries run on the table's view (see
    :mod:`relay.store.debezium`), and each connection sets the topic template
    the view reads."""

    def __init__(
        self,
        dsn: str,
        table: TableName,
        *,
        connect_timeout: float,
        statement_timeout: float | None,
        layout: TableLayout = NATIVE,
        columns_in_headers: bool = True,
    ) -> None:
        """``statement_timeout`` ``None`` is ``STATEMENT_TIMEOUT_SECONDS``; calls may take a margin longer.
        ``columns_in_headers``: Debezium's view shows the application's columns in ``headers``."""
        if statement_timeout is None:
            statement_timeout = STATEMENT_TIMEOUT_SECONDS  # read now, so that a test can shorten it
        self.dsn = dsn
        self.table = table
        self.layout = layout
        self._columns_in_headers = columns_in_headers
        relation = layout.relation(table)
        self.queries = {name: Statement.of(named.render(text, relation)) for name, text in named.queries().items()}
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self.call_timeout = statement_timeout + CALL_MARGIN_SECONDS
        self._lanes: dict[Lane, psycopg.AsyncConnection[Any]] = {}
        self._listen_conn: psycopg.AsyncConnection[Any] | None = None

    async def open(self, *, listen: bool = False) -> None:
        """Connect, check the table, and LISTEN if asked."""
        async with self.deadline():
            await self._connection("main")
            if listen:
                await self.listener()

    async def close(self) -> None:
        """Close every connection. Safe to call twice."""
        for conn in (*self._lanes.values(), self._listen_conn):
            if conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
        self._lanes.clear()
        self._listen_conn = None

    @contextlib.contextmanager
    def errors(self, conn: psycopg.AsyncConnection[Any] | None = None) -> Iterator[None]:
        """Translate errors; drop connections that broke, and hang up one that is read-only."""
        try:
            with translate_errors(self.dsn, self.table, self.layout):
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
        for lane, conn in list(self._lanes.items()):
            if conn.closed or conn.broken:
                del self._lanes[lane]
        if self._listen_conn is not None and (self._listen_conn.closed or self._listen_conn.broken):
            self._listen_conn = None

    @contextlib.asynccontextmanager
    async def deadline(self) -> AsyncIterator[None]:
        """Bound a call by ``call_timeout``: a frozen server becomes ``StoreUnavailable``."""
        try:
            async with asyncio.timeout(self.call_timeout):
                yield
        except TimeoutError:
            # psycopg cancelled the query, or closed the connection if it could not.
            self._drop_broken()
            raise StoreUnavailable(f"the database did not answer within {self.call_timeout:g}s") from None

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        kwargs = connect_kwargs(connect_timeout=self._connect_timeout, statement_timeout=self._statement_timeout)
        if self.layout.debezium:
            # The template is validated (letters, digits, ._- and braces): nothing to escape.
            kwargs["options"] += f" -c outbox_relay.topic_template={self.layout.topic_template}"
            if self._columns_in_headers:
                kwargs["options"] += " -c outbox_relay.columns_in_headers=on"
        with self.errors():
            conn = await psycopg.AsyncConnection.connect(self.dsn, **kwargs)
        try:
            check_encoding(conn)
        except ConfigError:
            await conn.close()
            raise
        return conn

    async def _connection(self, lane: Lane) -> psycopg.AsyncConnection[Any]:
        existing = self._lanes.get(lane)
        if existing is not None:
            return existing
        conn = await self._connect()
        if lane == "main":
            try:
                with self.errors():
                    await self._raw(conn, "check_table")
            except BaseException:
                await conn.close()
                raise
            logger.info("connected to the database", extra={"action": "db_connected", "table": str(self.table)})
        # Another task may have connected this lane meanwhile: keep theirs.
        existing = self._lanes.get(lane)
        if existing is not None:
            await conn.close()
            return existing
        self._lanes[lane] = conn
        return conn

    async def listener(self) -> psycopg.AsyncConnection[Any]:
        """The connection that LISTENs on the table's channel."""
        if self._listen_conn is None:
            conn = await self._connect()
            try:
                with self.errors():
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(await self._channel(conn))))
            except BaseException:
                # Also when cancelled: the loop stops waiting for a NOTIFY after the poll interval.
                await conn.close()
                raise
            self._listen_conn = conn
        return self._listen_conn

    async def _channel(self, conn: psycopg.AsyncConnection[Any]) -> str:
        """The channel the table's trigger notifies, or, with no trigger, the one migrate would give it."""
        params = {
            "table_name": ".".join(f'"{part}"' for part in self.table.parts),
            "trigger": self.table.derived("notify"),
        }
        row = await (await self._raw(conn, "notify_channel", params)).fetchone()
        if row is None or not row[0]:
            return self.table.channel
        # tgargs: each argument followed by a NUL byte; the channel is the first.
        return bytes(row[0]).split(b"\0", 1)[0].decode()

    async def _raw(
        self,
        conn: psycopg.AsyncConnection[Any],
        name: str,
        params: Mapping[str, Any] | None = None,
        row_factory: AsyncRowFactory[R] | None = None,
        *,
        any_time: bool = False,
    ) -> psycopg.AsyncRawCursor[Any]:
        """Run query ``name`` on ``conn`` (see :class:`Statement`) and return its cursor; ``any_time``
        as :meth:`fetch` takes it."""
        if row_factory is None:
            cur: psycopg.AsyncRawCursor[Any] = psycopg.AsyncRawCursor(conn)
        else:
            cur = psycopg.AsyncRawCursor(conn, row_factory=row_factory)
        if any_time:
            cur.adapters.register_loader("timestamptz", AnyTimeLoader)
        statement = self.queries[name]
        await cur.execute(statement.text, statement.values(params))
        return cur

    async def fetch(
        self,
        name: str,
        params: Mapping[str, Any],
        row_factory: AsyncRowFactory[R],
        *,
        lane: Lane = "main",
        any_time: bool = False,
    ) -> list[R]:
        """Run query ``name`` and return its rows, made by ``row_factory``; with ``any_time``, a
        time no datetime holds comes back as its text (see :class:`AnyTimeLoader`)."""
        async with self.deadline():
            conn = await self._connection(lane)
            with self.errors(conn):
                cur = await self._raw(conn, name, params, row_factory, any_time=any_time)
                return await cur.fetchall() if _has_rows(cur) else []

    async def execute(
        self, name: str, params: Mapping[str, Any], row_factory: AsyncRowFactory[R], *, lane: Lane = "main"
    ) -> psycopg.AsyncCursor[R]:
        """Run query ``name`` and return its cursor, rows not yet made: the lane is free for the
        next query meanwhile (:meth:`rows` makes them)."""
        async with self.deadline():
            conn = await self._connection(lane)
            with self.errors(conn):
                return await self._raw(conn, name, params, row_factory)

    async def rows(self, cursor: psycopg.AsyncCursor[R]) -> list[R]:
        """The rows of a cursor from :meth:`execute`."""
        with self.errors():
            return await cursor.fetchall() if _has_rows(cursor) else []

    async def run(self, name: str, params: Mapping[str, Any], *, lane: Lane = "main") -> int:
        """Run statement ``name``; return the rows it affected."""
        async with self.deadline():
            conn = await self._connection(lane)
            with self.errors(conn):
                cur = await self._raw(conn, name, params)
                return cur.rowcount
