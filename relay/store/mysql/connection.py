"""Connections to MySQL 8 and MariaDB: URL parsing, session settings, error translation, deadlines.

Every relay session runs at READ COMMITTED (docs/mysql.md says why: under
REPEATABLE READ a locking read takes gap and next-key locks that block the
writers' inserts) and in UTC. Connection losses drop the connection, so the
next call reconnects; deadlocks and lock-wait timeouts are retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit

import asyncmy
import pymysql
from asyncmy import errors as my_errors

from relay.config import MYSQL_SCHEMES, TableName, redact_url
from relay.errors import ConfigError, SchemaError, StoreError, StoreReadOnly, StoreUnavailable
from relay.secrets import Scrubber, one_line
from relay.store.mysql import sql as named
from relay.store.mysql.tls import Tls

logger = logging.getLogger(__name__)

SCHEMES = MYSQL_SCHEMES
DEFAULT_PORT = 3306
STATEMENT_TIMEOUT_SECONDS = 30.0
#: How long a statement waits for a row lock before 1205; the relay's own
#: statements lock rows that no one holds for long.
LOCK_WAIT_TIMEOUT_SECONDS = 10
# Beyond the server's own limits, a call whose peer answers nothing ends here.
CALL_MARGIN_SECONDS = 5.0
#: How many times a statement (or a claim's transaction) is tried again after a
#: deadlock or a lock-wait timeout before the call fails as unavailable.
LOCK_RETRIES = 3

#: Server errors that mean the connection is gone: reconnect.
CONNECTION_LOST = frozenset({2002, 2003, 2006, 2013, 2055, 4031})
#: A deadlock (1213) or a lock-wait timeout (1205): the transaction is worth trying again.
TRANSIENT = frozenset({1205, 1213})
#: --read-only / super_read_only (1290), a read-only transaction (1792), read-only mode (1836).
READ_ONLY = frozenset({1290, 1792, 1836})
#: The statement hit max_execution_time (MySQL 3024) or max_statement_time (MariaDB 1969).
STATEMENT_TIMEOUT = frozenset({3024, 1969})
_MYSQL_STATEMENT_TIMEOUT = 3024
_NO_TABLE, _NO_COLUMN = 1146, 1054
#: ER_UNKNOWN_TABLE: the table named in a database with no such table (information_schema.outbox).
_UNKNOWN_TABLE = 1109

R = TypeVar("R")
Lane = Literal["main", "settle", "stats"]


@dataclass(frozen=True, slots=True)
class Target:
    """Where to connect, parsed from a ``mysql://`` URL; ``password`` never shows in the repr."""

    host: str
    port: int
    user: str
    database: str
    password: str = field(default="", repr=False)
    #: From the URL's ``ssl-*`` options (relay/store/mysql/tls.py).
    tls: Tls = field(default_factory=Tls)

    @property
    def password_bytes(self) -> bytes:
        """The password as the drivers must get it: UTF-8 (given a ``str``, they encode it as Latin-1,
        which fails on most non-ASCII passwords and sends the wrong bytes for the rest)."""
        return self.password.encode()

    @classmethod
    def parse(cls, url: str) -> Target:
        """``mysql://user:pass@host:port/database[?ssl-mode=...&ssl-ca=...]`` (``mariadb://`` is the same);
        ``ConfigError`` otherwise."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"invalid database URL {redact_url(url)!r}: {Scrubber.of(url)(str(exc))}") from None
        if parts.scheme.lower() not in SCHEMES:
            raise ConfigError(f"not a MySQL URL: {redact_url(url)!r}")
        database = unquote(parts.path.lstrip("/"))
        if not parts.hostname or not database or "/" in database:
            raise ConfigError(
                f"MySQL URL {redact_url(url)!r} needs a host and a database: mysql://user:pass@host:3306/database"
            )
        tls = Tls.from_options(parse_qsl(parts.query, keep_blank_values=True), where=repr(redact_url(url)))
        return cls(
            host=parts.hostname,
            port=port or DEFAULT_PORT,
            user=unquote(parts.username or "root"),
            database=database,
            password=unquote(parts.password or ""),
            tls=tls,
        )


#: The errors of both drivers: asyncmy's (the relay, the admin commands) and PyMySQL's (migrate).
DRIVER_ERRORS = (my_errors.MySQLError, pymysql.MySQLError)
#: Both drivers' errors that mean the server could not be reached or the link was lost.
_LINK_ERRORS = (
    my_errors.OperationalError,
    my_errors.InterfaceError,
    pymysql.OperationalError,
    pymysql.InterfaceError,
    OSError,
)

#: What asyncmy's TLS handshake reports when the server answered in plain MySQL protocol.
_NOT_TLS = "WRONG_VERSION_NUMBER"


def describe(exc: BaseException, url: str) -> str:
    """A one-line description of a driver error with any password removed."""
    said = str(exc)
    if isinstance(exc, DRIVER_ERRORS) and len(exc.args) == 2 and isinstance(exc.args[0], int):
        said = f"MySQL error {exc.args[0]}: {exc.args[1]}"  # not the driver's tuple, (1049, "Unknown ...")
    text = one_line(said.replace(url, redact_url(url)), Scrubber.of(url)) or type(exc).__name__
    if _NOT_TLS in text:
        text += " (the server does not speak TLS: is TLS enabled on it?)"
    return text


def error_code(exc: BaseException) -> int | None:
    """The server's (or the client's) error number of a driver exception."""
    if isinstance(exc, DRIVER_ERRORS) and exc.args and isinstance(exc.args[0], int):
        return int(exc.args[0])
    return None


def translate(exc: BaseException, url: str, table: TableName) -> StoreError:
    """The relay's exception for a driver exception, without secrets."""
    code = error_code(exc)
    if code in (_NO_TABLE, _UNKNOWN_TABLE):
        return SchemaError(f"table {table} does not exist: run `outbox-relay migrate` first")
    if code == _NO_COLUMN:
        return SchemaError(f"table {table} is not an outbox table or is out of date ({describe(exc, url)})")
    if code in READ_ONLY:
        return StoreReadOnly(
            "the database is read-only (read_only, super_read_only or a replica): writes need the primary"
        )
    if code in STATEMENT_TIMEOUT:
        # Not "did not answer": the server answered that it stopped the statement at its time limit.
        setting = "MySQL max_execution_time" if code == _MYSQL_STATEMENT_TIMEOUT else "MariaDB max_statement_time"
        return StoreUnavailable(
            f"the statement ran longer than the statement timeout and the server stopped it ({setting} exceeded, "
            f"error {code}); what the statement changed was rolled back"
        )
    if code in CONNECTION_LOST or code in TRANSIENT or isinstance(exc, _LINK_ERRORS):
        return StoreUnavailable(describe(exc, url))
    return StoreError(describe(exc, url))


def no_greeting(connect_timeout: float) -> StoreUnavailable:
    """The error of a server that took the connection but did not complete the handshake in time."""
    return StoreUnavailable(
        f"the database did not answer within {connect_timeout:g}s of connecting "
        "(is the server up, and is it MySQL or MariaDB?)"
    )


def server_is_mariadb(version: str) -> bool:
    """Whether a ``VERSION()`` string is MariaDB's."""
    return "mariadb" in version.lower()


#: The relay's own sessions: strict, and nothing that changes how a literal or a name is read.
SESSION_SQL_MODE = "STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"


def session_settings(*, mariadb: bool, statement_timeout: float) -> list[str]:
    """The statements that set up a relay session (MySQL 8 and MariaDB spell the timeout differently)."""
    timeout = (
        f"SET SESSION max_statement_time = {statement_timeout:.3f}"
        if mariadb
        else f"SET SESSION max_execution_time = {max(1, int(statement_timeout * 1000))}"
    )
    return [
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET SESSION time_zone = '+00:00'",
        # The dialect the statements are written in, whatever the server's default: under
        # NO_BACKSLASH_ESCAPES asyncmy's backslash-escaped bytes (a key with a quote in the
        # claim's tail keys) broke the claim's SQL, and ANSI_QUOTES would read "..." as a name.
        f"SET SESSION sql_mode = '{SESSION_SQL_MODE}'",
        f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_SECONDS}",
        timeout,
    ]


class Database:
    """One outbox table's connections: claims and admin commands on one, settles
    on another, statistics on a third. Every call runs under a deadline."""

    def __init__(self, url: str, table: TableName, *, connect_timeout: float, statement_timeout: float | None) -> None:
        self.url = url
        self.target = Target.parse(url)
        # Built now, once for every connection: a file that cannot be read, or an encrypted key
        # without its passphrase, is a configuration error at start-up, not at the first connect.
        self.target.tls.context()
        self.table = table
        self.queries = {name: named.render(text, table) for name, text in named.queries().items()}
        self._connect_timeout = connect_timeout
        self.statement_timeout = STATEMENT_TIMEOUT_SECONDS if statement_timeout is None else statement_timeout
        self.call_timeout = self.statement_timeout + CALL_MARGIN_SECONDS
        self._lanes: dict[Lane, Any] = {}
        # One call at a time on a connection: asyncmy does not serialise them
        # itself (psycopg does), and two settles of a pipeline would otherwise
        # interleave on the wire and read each other's results.
        self._locks: dict[Lane, asyncio.Lock] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.mariadb = False
        self.server_version = ""

    async def open(self) -> None:
        """Connect the main lane and check the table."""
        async with self.deadline():
            await self.connection("main")

    async def close(self) -> None:
        """Close every connection. Safe to call twice."""
        lanes, self._lanes = list(self._lanes.values()), {}
        for conn in lanes:
            await self._hang_up(conn)

    async def _hang_up(self, conn: Any) -> None:
        if self._loop is not asyncio.get_running_loop():
            conn.close()  # its event loop is gone: only the socket is left to close
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.ensure_closed(), 1.0)
        conn.close()

    def drop(self, lane: Lane) -> None:
        """Forget a lane's connection (closed at once): the next call reconnects."""
        conn = self._lanes.pop(lane, None)
        if conn is not None:
            conn.close()

    @contextlib.asynccontextmanager
    async def deadline(self) -> AsyncIterator[None]:
        """Bound a call by ``call_timeout``: a frozen server becomes ``StoreUnavailable``."""
        try:
            async with asyncio.timeout(self.call_timeout):
                yield
        except TimeoutError:
            raise StoreUnavailable(
                f"the database did not answer within {self.call_timeout:g}s (the statement timeout, "
                f"{self.statement_timeout:g}s, and a margin): the call was given up and its transaction rolled back"
            ) from None

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Translate driver errors into the relay's."""
        try:
            yield
        except (my_errors.MySQLError, OSError) as exc:
            raise translate(exc, self.url, self.table) from exc

    async def _connect(self) -> Any:
        # asyncmy's connect_timeout bounds the TCP connect alone: a server that takes the
        # connection and never greets (frozen, or PostgreSQL's port) held it to the call's
        # deadline. The whole handshake and session set-up get the connect timeout, as libpq's does.
        try:
            async with asyncio.timeout(self._connect_timeout):
                return await self._handshake()
        except TimeoutError:
            raise no_greeting(self._connect_timeout) from None

    async def _handshake(self) -> Any:
        target = self.target
        with self.errors():
            conn = await asyncmy.connect(
                host=target.host,
                port=target.port,
                user=target.user,
                password=target.password_bytes,
                database=target.database,
                connect_timeout=max(1, round(self._connect_timeout)),
                autocommit=True,
                charset="utf8mb4",
                program_name="outbox-relay",
                ssl=target.tls.context(),
            )
            try:
                async with conn.cursor() as cur:
                    await cur.execute("SELECT VERSION()")
                    self.server_version = str((await cur.fetchone())[0])
                    self.mariadb = server_is_mariadb(self.server_version)
                    for statement in session_settings(mariadb=self.mariadb, statement_timeout=self.statement_timeout):
                        await cur.execute(statement)
            except BaseException:
                conn.close()
                raise
        return conn

    async def connection(self, lane: Lane) -> Any:
        """The lane's connection, connected (and, for the main lane, the table checked) if need be."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Connections belong to the event loop that made them.
            for conn in self._lanes.values():
                conn.close()
            self._lanes.clear()
            self._locks.clear()
            self._loop = loop
        existing = self._lanes.get(lane)
        if existing is not None:
            return existing
        conn = await self._connect()
        if lane == "main":
            try:
                with self.errors():
                    async with conn.cursor() as cur:
                        await cur.execute(self.queries["check_table"])
                        await cur.fetchall()
            except BaseException:
                conn.close()
                raise
            logger.info("connected to the database", extra={"action": "db_connected", "table": str(self.table)})
        existing = self._lanes.get(lane)
        if existing is not None:
            conn.close()
            return existing
        self._lanes[lane] = conn
        return conn

    def _lock(self, lane: Lane) -> asyncio.Lock:
        if self._loop is not asyncio.get_running_loop():
            self._locks.clear()  # locks belong to a loop too; connection() drops the old connections
        return self._locks.setdefault(lane, asyncio.Lock())

    async def call(self, lane: Lane, work: Callable[[Any], Awaitable[R]]) -> R:
        """Run ``work(cursor)`` on the lane's connection under the deadline, retrying lock conflicts.

        A connection that failed mid-call (lost, cancelled, timed out, or left
        in a transaction) is dropped, so that the next call starts afresh.
        """
        for attempt in range(LOCK_RETRIES + 1):
            try:
                async with self.deadline(), self._lock(lane):
                    conn = await self.connection(lane)
                    try:
                        async with conn.cursor() as cur:
                            with self.errors():
                                return await work(cur)
                    except StoreUnavailable as exc:
                        code = error_code(exc.__cause__) if exc.__cause__ else None
                        if code in TRANSIENT and attempt < LOCK_RETRIES:
                            with contextlib.suppress(Exception):
                                await conn.rollback()
                            logger.info("lock conflict, trying again: %s", exc, extra={"action": "lock_retry"})
                            continue
                        self.drop(lane)
                        raise
                    except BaseException:
                        self.drop(lane)
                        raise
            except StoreReadOnly:
                self.drop(lane)
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def fetch(self, name: str, params: Any = None, *, lane: Lane = "main") -> list[dict[str, Any]]:
        """Run query ``name``; its rows as dicts by column name."""

        async def work(cur: Any) -> list[dict[str, Any]]:
            await cur.execute(self.queries[name], params)
            return rows_of(cur, await cur.fetchall())

        return await self.call(lane, work)

    async def run(self, name: str, params: Any = None, *, lane: Lane = "main") -> int:
        """Run statement ``name``; the rows it affected."""

        async def work(cur: Any) -> int:
            return int(await cur.execute(self.queries[name], params))

        return await self.call(lane, work)


def rows_of(cur: Any, rows: Any) -> list[dict[str, Any]]:
    """Rows by column name (the cursor's description names them)."""
    names = [column[0] for column in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in rows or ()]


async def transaction(cur: Any, work: Callable[[], Awaitable[R]]) -> R:
    """Run ``work`` in a transaction on ``cur``'s connection: commit, or roll back on any error."""
    await cur.execute("START TRANSACTION")
    try:
        result = await work()
    except Exception:
        # The server answered: roll back on this connection. A cancelled call
        # (the deadline) does not wait for a ROLLBACK a frozen server would not
        # answer: its connection is dropped, which rolls back.
        with contextlib.suppress(Exception):
            await cur.execute("ROLLBACK")
        raise
    await cur.execute("COMMIT")
    return result


async def alongside(statement: Awaitable[Any] | None, work: Callable[[], R]) -> R:
    """``work()``, run while the server runs ``statement`` (sent first), once both are done; ``work()`` alone
    without one. The statement goes when this yields to the loop once; ``work`` must not use the connection."""
    if statement is None:
        return work()
    running = asyncio.ensure_future(statement)
    try:
        await asyncio.sleep(0)  # the statement is written to the socket; its answer is awaited below
        result = work()
    except BaseException:
        running.cancel()  # cancelled here (the deadline): not waiting on a server that may not answer
        raise
    await running
    return result
