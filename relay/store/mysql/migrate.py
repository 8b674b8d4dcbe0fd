"""``outbox-relay migrate`` on MySQL 8 and MariaDB: create or upgrade an outbox table.

MySQL commits each DDL statement on its own, so the steps cannot share one
transaction as on PostgreSQL. Instead a named lock (``GET_LOCK``) on the table
name serialises migrations started at once: the second waits, then finds the
steps applied and does nothing. Each step's version is recorded right after
it; a step that fails half-way is reported, and its statements are written to
be checked by hand (docs/mysql.md). A step's wait for the table's metadata
lock is short, and the migration tried again with backoff: behind an open
transaction that wrote an event, a waiting ALTER holds every writer up
(:mod:`relay.store.lock_waits`). Each step is one statement, so trying it again
is safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import pymysql

from relay.config import CONNECT_TIMEOUT_SECONDS, TableName
from relay.errors import StoreUnavailable
from relay.store import lock_waits
from relay.store.mysql import privileges
from relay.store.mysql import sql as named
from relay.store.mysql.connection import Target, no_greeting, translate

logger = logging.getLogger(__name__)

_LOCK_NAMESPACE = "outbox-relay migrate "
_LOCK_NAME_CHARS = 64
#: How long a migration waits for another one of the same table to finish.
LOCK_WAIT_SECONDS = 60


@contextlib.contextmanager
def connect(url: str, table: TableName) -> Iterator[Any]:
    """A PyMySQL connection (autocommit, UTC), its errors translated without secrets."""
    target = Target.parse(url)
    try:
        context = target.tls.context()
        conn = pymysql.connect(
            host=target.host,
            port=target.port,
            user=target.user,
            password=target.password_bytes,
            database=target.database,
            connect_timeout=max(1, round(CONNECT_TIMEOUT_SECONDS)),
            # PyMySQL's connect_timeout bounds the TCP connect alone: a server that takes the
            # connection and never greets (frozen, or PostgreSQL's port) held migrate for ever.
            # The handshake reads under these; the migration's own statements do not (below).
            read_timeout=CONNECT_TIMEOUT_SECONDS,
            write_timeout=CONNECT_TIMEOUT_SECONDS,
            autocommit=True,
            charset="utf8mb4",
            ssl=context,
            # ssl-mode=DISABLED means plain TCP: PyMySQL told nothing would try TLS where the server offers it
            # (unverified, and an SSL context built per connection).
            ssl_disabled=context is None,
        )
    except (pymysql.MySQLError, OSError) as exc:
        if isinstance(exc.__context__, TimeoutError):  # the socket timed out in the handshake
            raise no_greeting(CONNECT_TIMEOUT_SECONDS) from exc
        raise translate(exc, url, table) from exc
    # A migration's DDL on a big table, or its wait for another migrate's lock, may take longer
    # than a handshake: no read or write timeout from here on (PyMySQL sets one on the next I/O).
    # (PyMySQL's own attributes, which no public call sets after connecting, and its stubs omit.)
    unbounded: Any = conn
    unbounded._read_timeout = unbounded._write_timeout = None
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION time_zone = '+00:00'")
        yield conn
    except (pymysql.MySQLError, OSError) as exc:
        raise translate(exc, url, table) from exc
    finally:
        conn.close()


def _plain(columns: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(column.strip("`") for column in columns)


def _current_database(cur: Any) -> str:
    cur.execute("SELECT DATABASE()")
    return str(cur.fetchone()[0])


def _lock_name(cur: Any, table: TableName) -> str:
    """The named lock of ``table``'s migrations, one name however the table is spelt.

    ``outbox`` with a URL to ``shop`` and ``shop.outbox`` are one table: keyed on
    the spelling, two migrates of it at once took two locks and ran the same
    steps side by side (error 1060, duplicate column).
    """
    schema = table.schema or _current_database(cur)
    qualified = f"{schema}.{table.name}"
    name = _LOCK_NAMESPACE + qualified
    # GET_LOCK names are at most 64 characters: a longer one by its digest, so that no two tables share a lock.
    return (
        name if len(name) <= _LOCK_NAME_CHARS else _LOCK_NAMESPACE + hashlib.sha256(qualified.encode()).hexdigest()[:40]
    )


def _take_lock(cur: Any, table: TableName) -> str:
    """Take ``table``'s migration lock (waiting up to ``LOCK_WAIT_SECONDS``); its name."""
    lock = _lock_name(cur, table)
    cur.execute("SELECT GET_LOCK(%s, %s)", (lock, LOCK_WAIT_SECONDS))
    if (cur.fetchone() or (None,))[0] != 1:
        raise StoreUnavailable(f"another migration of {table} held its lock for {LOCK_WAIT_SECONDS}s")
    return lock


#: "Lock wait timeout exceeded": a metadata lock (lock_wait_timeout) or a row lock (innodb_lock_wait_timeout).
_LOCK_WAIT_TIMEOUT = 1205


def migrate(
    url: str,
    table: TableName,
    *,
    lock_wait_seconds: float = lock_waits.LOCK_WAIT_SECONDS,
    retry_seconds: float = lock_waits.LOCK_RETRY_SECONDS,
) -> list[int]:
    """Apply the migrations ``table`` lacks; return the versions applied.

    Each lock is waited for at most ``lock_wait_seconds`` (whole seconds, at
    least one, as the servers count them), and the whole tried again for
    ``retry_seconds``.
    """
    return lock_waits.retrying(
        lambda: _migrate_once(url, table, lock_wait_seconds=lock_wait_seconds), retry_seconds=retry_seconds
    )


@contextlib.contextmanager
def _naming_lock_holders(cur: Any, table: TableName, wait_seconds: int) -> Iterator[None]:
    """Turn a lock wait that ran out into :class:`LockWaitTimeout`, naming the sessions that hold ``table``."""
    try:
        yield
    except pymysql.MySQLError as exc:
        if exc.args[:1] != (_LOCK_WAIT_TIMEOUT,):
            raise
        raise lock_waits.LockWaitTimeout(table, wait_seconds, _lock_holders(cur, table)) from None


def _lock_holders(cur: Any, table: TableName) -> list[lock_waits.Holder]:
    """The sessions holding ``table`` now, oldest transaction first (at most five): its metadata locks
    where MariaDB's METADATA_LOCK_INFO plugin is there, otherwise every session with an open InnoDB
    transaction (one that wrote an event holds the table's metadata lock until it ends)."""
    schema = table.schema or _current_database(cur)
    by_lock = (
        "SELECT DISTINCT p.id, p.user, '', COALESCE(p.command, ''), TIMESTAMPDIFF(SECOND, t.trx_started, NOW())"
        " FROM information_schema.METADATA_LOCK_INFO AS m"
        " JOIN information_schema.PROCESSLIST AS p ON p.id = m.thread_id"
        " LEFT JOIN information_schema.INNODB_TRX AS t ON t.trx_mysql_thread_id = p.id"
        " WHERE m.table_schema = %s AND m.table_name = %s AND p.id <> CONNECTION_ID()"
        " ORDER BY t.trx_started LIMIT 5"
    )
    # Those whose session is in the table's database, if any: the server's other databases have
    # transactions of their own.
    by_transaction = (
        "SELECT p.id, p.user, '', COALESCE(p.command, ''), TIMESTAMPDIFF(SECOND, t.trx_started, NOW())"
        " FROM information_schema.INNODB_TRX AS t JOIN information_schema.PROCESSLIST AS p"
        " ON p.id = t.trx_mysql_thread_id WHERE p.id <> CONNECTION_ID()"
        " AND (p.db = %s OR NOT EXISTS (SELECT 1 FROM information_schema.INNODB_TRX AS t2"
        " JOIN information_schema.PROCESSLIST AS p2 ON p2.id = t2.trx_mysql_thread_id"
        " WHERE p2.db = %s AND p2.id <> CONNECTION_ID()))"
        " ORDER BY t.trx_started LIMIT 5"
    )
    try:
        cur.execute(by_lock, (schema, table.name))
    except pymysql.MySQLError:  # no such table: the plugin is not installed (or MySQL 8)
        cur.execute(by_transaction, (schema, schema))
    return [
        lock_waits.Holder(int(session), str(user), str(app), str(command).lower(), None if age is None else float(age))
        for session, user, app, command, age in cur.fetchall()
    ]


def _migrate_once(url: str, table: TableName, *, lock_wait_seconds: float) -> list[int]:
    ids = named.identifiers(table)
    # Whole seconds on both servers (MariaDB refuses a fraction).
    wait = max(1, round(lock_wait_seconds))
    with connect(url, table) as conn, conn.cursor() as cur:
        lock = _take_lock(cur, table)
        cur.execute("SET SESSION lock_wait_timeout = %s, innodb_lock_wait_timeout = %s", (wait, wait))
        try:
            if table.schema:
                cur.execute(f"CREATE DATABASE IF NOT EXISTS {named.quote(table.schema)}")
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {ids['version_table']} ("
                " version INT NOT NULL PRIMARY KEY, name VARCHAR(200) NOT NULL,"
                " applied_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))) ENGINE = InnoDB"
            )
            cur.execute(f"SELECT version FROM {ids['version_table']}")  # noqa: S608 - identifiers only
            done = {row[0] for row in cur.fetchall()}
            applied = []
            for step in named.migrations():
                if step.version in done:
                    continue
                for statement in named.statements(named.render(step.template, table)):
                    with _naming_lock_holders(cur, table, wait):
                        cur.execute(statement)
                cur.execute(
                    f"INSERT INTO {ids['version_table']} (version, name) VALUES (%s, %s)",  # noqa: S608
                    (step.version, step.name),
                )
                applied.append(step.version)
                logger.info(
                    "applied migration %04d_%s",
                    step.version,
                    step.name,
                    extra={"action": "migrate", "table": str(table)},
                )
        finally:
            cur.execute("SELECT RELEASE_LOCK(%s)", (lock,))
    return applied


def schema_version(url: str, table: TableName) -> int:
    """The newest migration applied to ``table`` (0 when none)."""
    ids = named.identifiers(table)
    with connect(url, table) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT MAX(version) FROM {ids['version_table']}")  # noqa: S608 - identifiers only
        row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


#: What writers may set: the application's columns. Everything else is the relay's.
WRITER_COLUMNS = (
    "topic", "`key`", "payload", "payload_bytes", "content_type", "headers", "idempotency_key", "deliver_at",
    "priority",
)  # fmt: skip
#: What relays may change: the columns they own, and deliver_at (retries and held-back events wait).
RELAY_COLUMNS = (
    "state", "attempts", "last_error", "lease_owner", "claim_token", "lease_expires_at", "published_at", "failed_at",
    "deliver_at",
)  # fmt: skip
#: "There is no such grant defined": a REVOKE of what a role never had.
_NO_SUCH_GRANT = (1141, 1147)


def create_roles(url: str, table: TableName, *, relay_role: str, writer_role: str) -> None:
    """Create (if missing) a relay role and a writer role with the least they need, column by column.

    As on PostgreSQL (``relay.store.migrate.create_roles``): a writer may
    INSERT the application's columns and nothing else. ``publish()`` takes a
    duplicate idempotency key's error 1062 as "already written";
    ``ON DUPLICATE KEY UPDATE`` would need UPDATE on every inserted column on
    MariaDB. Grant the roles to your users (``GRANT outbox_relay TO app@'%'``)
    and make them default (``SET DEFAULT ROLE``).
    """
    ids = named.identifiers(table)
    relay, writer = named.quote(relay_role), named.quote(writer_role)
    statements = [
        f"GRANT SELECT, DELETE ON {ids['table']} TO {relay}",
        f"GRANT UPDATE ({', '.join(RELAY_COLUMNS)}) ON {ids['table']} TO {relay}",
        f"GRANT SELECT ON {ids['version_table']} TO {relay}",
        f"GRANT INSERT ({', '.join(WRITER_COLUMNS)}) ON {ids['table']} TO {writer}",
        # publish()'s question when its idempotency key is taken (migration 0006).
        f"GRANT EXECUTE ON FUNCTION {ids['same_event_func']} TO {writer}",
    ]
    with connect(url, table) as conn, conn.cursor() as cur:
        lock = _take_lock(cur, table)
        try:
            for role in (relay, writer):
                cur.execute(f"CREATE ROLE IF NOT EXISTS {role}")
                # Revoking table privileges revokes the column ones too; a role may have had none.
                for on in (ids["table"], ids["version_table"]):
                    try:
                        cur.execute(f"REVOKE ALL PRIVILEGES ON {on} FROM {role}")
                    except pymysql.MySQLError as exc:
                        if exc.args[0] not in _NO_SUCH_GRANT:
                            raise
            for statement in statements:
                cur.execute(statement)
            database, version_table = table.schema or _current_database(cur), table.derived("schema_version")
            relay_may: privileges.Allowed = {
                table.name: {"SELECT": None, "DELETE": None, "UPDATE": frozenset(_plain(RELAY_COLUMNS))},
                version_table: {"SELECT": None},
            }
            writer_may: privileges.Allowed = {
                table.name: {"INSERT": frozenset(_plain(WRITER_COLUMNS))},
                version_table: {},
            }
            privileges.refuse_excess(cur, relay_role, database=database, allowed=relay_may)
            privileges.refuse_excess(cur, writer_role, database=database, allowed=writer_may)
        finally:
            cur.execute("SELECT RELEASE_LOCK(%s)", (lock,))
    logger.info("granted roles %s and %s", relay_role, writer_role, extra={"action": "create_roles"})
