"""Connections to PostgreSQL: their settings, error translation, and a deadline on every call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg.abc import Buffer
from psycopg.rows import AsyncRowFactory, BaseRowFactory, RowMaker
from psycopg.types.datetime import TimestamptzLoader

from relay.config import CONNECT_TIMEOUT_SECONDS, NATIVE, TableLayout, TableName, redact_url
from relay.errors import ConfigError, SchemaError, StoreError, StoreReadOnly, StoreUnavailable
from relay.secrets import Scrubber, one_line, secrets_in
from relay.store import sql as named

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

R = TypeVar("R")


class AnyTimeLoader(TimestamptzLoader):
    """A ``timestamptz`` as a datetime, or as PostgreSQL's text when no datetime holds it.

    Plain SQL may write ``'infinity'``, ``'-infinity'`` or year 20000 into any
    time column; an operator's ``inspect`` or ``dead`` must still show the row.
    Slower than the built-in loader: for admin commands, not for claims.
    """

    def load(self, data: Buffer) -> datetime | str:  # type: ignore[override]
        try:
            return super().load(data)
        except psycopg.DataError:
            return bytes(data).decode()


#: Which connection a statement runs on: claims and admin commands, settles, or statistics.
Lane = Literal["main", "settle", "stats"]

_PLACEHOLDER = re.compile(rb"%\((\w+)\)s")


@dataclass(frozen=True, slots=True)
class Statement:
    """A named query as it is sent: PostgreSQL's own ``$n`` placeholders, and the parameters'
    names in their order.

    psycopg turns ``%(name)s`` placeholders into ``$n`` on every execute, a
    regular-expression pass over the text that it caches only for texts under
    4 kB: the claim (5 kB) paid it each time, as much as a tenth of the
    relay's own time per batch at a few hundred events a second. Done once
    here, the statement runs on a raw cursor, which sends it as it is.
    """

    text: bytes
    names: tuple[str, ...]

    @classmethod
    def of(cls, query: sql.Composed) -> Statement:
        names: list[str] = []

        def number(match: re.Match[bytes]) -> bytes:
            name = match.group(1).decode()
            if name not in names:
                names.append(name)
            return b"$%d" % (names.index(name) + 1)

        text = _PLACEHOLDER.sub(number, query.as_bytes(None))
        if b"%" in text:  # only %(name)s placeholders are taken; a literal % would need doubling
            raise ValueError(f"a named query holds a % that is no %(name)s placeholder: {text[:80]!r}")
        return cls(text, tuple(names))

    def values(self, params: Mapping[str, Any] | None) -> list[Any] | None:
        """``params`` in the order of the placeholders (None for a statement that takes none)."""
        if not self.names:
            return None
        assert params is not None, "the statement takes parameters"
        return [params[name] for name in self.names]


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


def password_of(dsn: str) -> str | None:
    """The password in ``dsn``, so that error messages can be scrubbed of it."""
    return next(iter(secrets_in(dsn)), None)


def describe(exc: BaseException, dsn: str) -> str:
    """A one-line description of a database error with any password removed."""
    return one_line(str(exc).replace(dsn, redact_url(dsn)), Scrubber.of(dsn)) or type(exc).__name__


#: libpq's words for a connection option with a value it cannot take: one it does not know
#: (invalid sslmode value: "x"), no whole number (invalid integer value "x" for connection option
#: "port"), no port (invalid port number: "99999"), or more ports than hosts. No wait mends these.
_BAD_OPTION_VALUE = re.compile(
    r'\binvalid [\w ]+ value: |\binvalid integer value "|\binvalid port number: |\bcould not match \d+ port numbers'
)


def check_encoding(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """``ConfigError`` unless the database is UTF8 (libpq has its encoding already: no round trip).

    On SQL_ASCII, text comes back as bytes and each writer's bytes are stored as
    its client encoding made them (one key, two spellings); on LATIN1 and the
    like, jsonb cannot hold the ``\\uXXXX`` escapes of non-ASCII characters.
    """
    encoding = conn.info.parameter_status("server_encoding")
    if encoding is not None and encoding != "UTF8":
        raise ConfigError(
            f"the database {conn.info.dbname!r} is encoded in {encoding}: the outbox needs a UTF8 database "
            "(CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
        )


@contextlib.contextmanager
def translate_errors(dsn: str, table: TableName, layout: TableLayout | None = None) -> Iterator[None]:
    """Turn psycopg exceptions into the relay's hierarchy, without secrets; with the ``layout``
    the command was given, a missing table or column says which flag may be wrong."""
    try:
        yield
    except psycopg.errors.UndefinedTable:
        hint = ""
        if layout is not None and layout.debezium:
            hint = " (with --table-layout debezium, the relay reads its view over Debezium's table; drop the flag "
            hint += "if the table is the relay's own)"
        raise SchemaError(f"table {table} does not exist: run `outbox-relay migrate` first{hint}") from None
    except psycopg.errors.UndefinedColumn as exc:
        hint = (
            ""
            if layout is None or layout.debezium
            else "; if it is Debezium's outbox table, pass --table-layout debezium"
        )
        raise SchemaError(
            f"table {table} is not an outbox table or is out of date ({exc.diag.message_primary}){hint}"
        ) from None
    except psycopg.ProgrammingError as exc:
        if exc.sqlstate is None:  # libpq refused the URL itself: an unknown parameter or option
            raise ConfigError(f"invalid database URL: {describe(exc, dsn)}") from None
        raise StoreError(describe(exc, dsn)) from exc
    except psycopg.OperationalError as exc:
        if exc.sqlstate is None and _BAD_OPTION_VALUE.search(str(exc)):  # sslmode=bogus, and the like
            raise ConfigError(f"invalid database URL: {describe(exc, dsn)}") from None
        raise StoreUnavailable(describe(exc, dsn)) from exc
    except psycopg.errors.ReadOnlySqlTransaction:
        # A failover's old primary, or a database made read-only for maintenance:
        # unavailable, so the relay waits for writes instead of stopping.
        raise StoreReadOnly(
            "the database is read-only (a hot standby, or default_transaction_read_only is on): writes need the primary"
        ) from None
    except psycopg.Error as exc:
        raise StoreError(describe(exc, dsn)) from exc


def id_array(ids: Iterable[int]) -> str:
    """Event ids as one PostgreSQL array literal, for ``%(ids)s::bigint[]``.

    psycopg adapts a list item by item in Python; a batch's thousand ids cost
    about a millisecond that way, as one string a tenth of that.
    """
    return "{" + ",".join(map(str, ids)) + "}"


def _has_rows(cursor: psycopg.AsyncCursor[Any]) -> bool:
    """Whether the cursor's statement returned rows (a ``SELECT``, a ``RETURNING``); cheaper than
    ``cursor.description``, which builds a column object for each column."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def column_index(cursor: psycopg.AsyncCursor[Any]) -> dict[str, int]:
    """Where each column of the cursor's result is, by name (read from the result itself: once per
    claim, ``cursor.description`` built a column object for each column, twice)."""
    result = cursor.pgresult
    if result is None:
        return {}
    # UTF-8: the relay's connections check that the database is UTF8 (check_encoding).
    return {(result.fname(i) or b"").decode(): i for i in range(result.nfields)}


def column_of(name: str, kind: type[R]) -> BaseRowFactory[R]:
    """A row factory that reads each row as the value of its column ``name``."""

    def factory(cursor: Any) -> RowMaker[R]:
        index = [column.name for column in cursor.description or ()].index(name)

        def make(values: Any) -> R:
            value: R = values[index]
            return value

        return make

    return factory


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
