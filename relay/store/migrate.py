"""``outbox-relay migrate``: create or upgrade an outbox table.

All steps run in one transaction behind an advisory lock keyed on the table
(its schema resolved), so two migrations started at once apply each step exactly once, and a
failed step leaves nothing half-done. Each lock on the table is waited for a
short while, and the whole tried again with backoff, so that an application's
open transaction never holds writers up behind a waiting migration for longer
than that while (:mod:`relay.store.lock_waits`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import sql

from relay.config import NATIVE, TableLayout, TableName
from relay.errors import SchemaError
from relay.store import lock_waits
from relay.store import sql as named
from relay.store.postgres import privileges
from relay.store.postgres.connection import check_encoding, connect_kwargs, translate_errors

logger = logging.getLogger(__name__)

_LOCK_NAMESPACE = "outbox-relay migrate "
#: Debezium's layout numbers its steps from here (relay/store/debezium/), so the two never mix.
DEBEZIUM_FIRST_STEP = 1001


def migrate(
    dsn: str,
    table: TableName,
    *,
    notify: bool | None = None,
    layout: TableLayout = NATIVE,
    lock_wait_seconds: float = lock_waits.LOCK_WAIT_SECONDS,
    retry_seconds: float = lock_waits.LOCK_RETRY_SECONDS,
) -> list[int]:
    """Apply the migrations ``table`` lacks; return the versions applied.

    ``notify`` switches the NOTIFY-on-insert trigger on or off (``None`` leaves
    it as it is): the trigger wakes relays at once but makes every inserting
    commit take a global lock. With Debezium's ``layout``, the table is
    Debezium's outbox table (created if missing): see :mod:`relay.store.debezium`.
    Each lock is waited for at most ``lock_wait_seconds`` (writers queue behind
    the wait), and the whole is tried again for ``retry_seconds``
    (:mod:`relay.store.lock_waits`).
    """
    return lock_waits.retrying(
        lambda: _migrate_once(dsn, table, notify=notify, layout=layout, lock_wait_seconds=lock_wait_seconds),
        retry_seconds=retry_seconds,
    )


def _migrate_once(
    dsn: str, table: TableName, *, notify: bool | None, layout: TableLayout, lock_wait_seconds: float
) -> list[int]:
    with (
        translate_errors(dsn, table),
        _naming_lock_holders(dsn, table, lock_wait_seconds),
        psycopg.connect(dsn, **connect_kwargs()) as conn,
        conn.transaction(),
    ):
        check_encoding(conn)
        given, table = table, _resolved(conn, table)
        ids = named.identifiers(table)
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [_LOCK_NAMESPACE + str(table)])
        # From here on (not for another migrate's advisory lock, which is the wait above): see lock_waits.
        conn.execute("SELECT set_config('lock_timeout', %s, true)", [f"{max(1, round(lock_wait_seconds * 1000))}ms"])
        # Only a schema the name gave: CREATE SCHEMA asks for CREATE on the database even when it exists.
        if given.schema and table.schema:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table.schema)))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {version_table} ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(**ids)
        )
        done = {row[0] for row in conn.execute(sql.SQL("SELECT version FROM {version_table}").format(**ids))}
        applied = []
        if not layout.debezium and any(version >= DEBEZIUM_FIRST_STEP for version in done):
            raise SchemaError(f"table {given} has Debezium's layout: pass --table-layout debezium")
        if layout.debezium:
            from relay.store import debezium

            applied = debezium.migrate(conn, table, done)
        for step in () if layout.debezium else named.migrations():
            if step.version in done:
                continue
            conn.execute(named.render(step.template, table))
            conn.execute(
                sql.SQL("INSERT INTO {version_table} (version, name) VALUES (%s, %s)").format(**ids),
                [step.version, step.name],
            )
            applied.append(step.version)
            logger.info(
                "applied migration %04d_%s",
                step.version,
                step.name,
                extra={"action": "migrate", "table": str(table)},
            )
        _check_names(conn, table, given, layout)
        if notify is not None:
            switch = sql.SQL("ENABLE") if notify else sql.SQL("DISABLE")
            conn.execute(sql.SQL("ALTER TABLE {table} {} TRIGGER {notify_trigger}").format(switch, **ids))
    return applied


@contextlib.contextmanager
def _naming_lock_holders(dsn: str, table: TableName, wait_seconds: float) -> Iterator[None]:
    """Turn a lock wait that ran out into :class:`LockWaitTimeout`, naming the sessions that hold ``table``."""
    try:
        yield
    except psycopg.errors.LockNotAvailable:
        raise lock_waits.LockWaitTimeout(table, wait_seconds, _lock_holders(dsn, table)) from None


def _lock_holders(dsn: str, table: TableName) -> list[lock_waits.Holder]:
    """The sessions holding a lock on ``table`` now, oldest transaction first (at most five)."""
    with psycopg.connect(dsn, **connect_kwargs()) as conn:
        rows = conn.execute(
            "SELECT DISTINCT a.pid, coalesce(a.usename, ''), coalesce(a.application_name, ''),"
            " coalesce(a.state, ''), extract(epoch FROM now() - a.xact_start)::float8, a.xact_start"
            " FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
            " WHERE l.locktype = 'relation' AND l.granted AND l.relation = to_regclass(%s)"
            " AND a.pid <> pg_backend_pid() ORDER BY a.xact_start NULLS LAST LIMIT 5",
            [".".join('"' + part.replace('"', '""') + '"' for part in table.parts)],
        ).fetchall()
    return [lock_waits.Holder(pid, user, app, state, seconds) for pid, user, app, state, seconds, _ in rows]


#: The relations migrate names after the table with IF NOT EXISTS (so that one built by hand first, CONCURRENTLY,
#: is kept): suffix, and the kind the name must be of the table's: an index on it, or a sequence.
_KEPT_IF_THERE = {"claim_idx": "i", "key_idx": "i", "failed_idx": "i"}
_KEPT_IF_THERE_DEBEZIUM = {**_KEPT_IF_THERE, "relay_seq_idx": "i", "relay_seq": "S"}


def _check_names(conn: psycopg.Connection[Any], table: TableName, given: TableName, layout: TableLayout) -> None:
    """``SchemaError`` if a name migrate gives one of the table's indexes (or sequence) is another relation's.

    CREATE ... IF NOT EXISTS skips a name any relation of the schema holds: another table's
    (``outbox_failed_idx``, say, beside ``outbox``) would leave this one without its index.
    """

    def quoted(name: str) -> str:
        return ".".join('"' + part.replace('"', '""') + '"' for part in (*table.parts[:-1], name))

    for suffix, kind in (_KEPT_IF_THERE_DEBEZIUM if layout.debezium else _KEPT_IF_THERE).items():
        name = table.derived(suffix)
        row = conn.execute(
            "SELECT c.relkind::text, coalesce(i.indrelid = %s::regclass, d.refobjid = %s::regclass, false)"
            " FROM pg_class AS c LEFT JOIN pg_index AS i ON i.indexrelid = c.oid"
            " LEFT JOIN pg_depend AS d ON d.objid = c.oid AND d.classid = 'pg_class'::regclass AND d.deptype = 'a'"
            " WHERE c.oid = to_regclass(%s)",
            [quoted(table.name), quoted(table.name), quoted(name)],
        ).fetchone()
        if row is not None and not (row[0] == kind and row[1]):
            raise SchemaError(
                f"table {given}: the name {name}, which migrate gives its {suffix.replace('_', ' ')}, "
                "is another relation's: rename that one or choose another --table"
            )


def _resolved(conn: psycopg.Connection[Any], table: TableName) -> TableName:
    """``table`` with its schema: the one search_path finds it in, or, when there is no such table
    yet, the one it is created in. Another schema earlier on search_path would otherwise get a
    second table that shadows the first, and two tables of one name in two schemas one channel."""
    if table.schema:
        return table
    row = conn.execute(
        "SELECT coalesce((SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE c.oid = to_regclass(%s)), current_schema())",
        [f'"{table.name}"'],
    ).fetchone()
    # No schema on search_path exists: CREATE TABLE will say so.
    return TableName(str(row[0]), table.name) if row and row[0] is not None else table


def schema_version(dsn: str, table: TableName) -> int:
    """The newest migration applied to ``table`` (0 when none)."""
    ids = named.identifiers(table)
    with translate_errors(dsn, table), psycopg.connect(dsn, **connect_kwargs()) as conn:
        row = conn.execute(sql.SQL("SELECT max(version) FROM {version_table}").format(**ids)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


#: What writers may set: the application's columns. Everything else is the relay's.
WRITER_COLUMNS = (
    "topic", "key", "payload", "payload_bytes", "content_type", "headers", "idempotency_key", "deliver_at", "priority",
)  # fmt: skip
#: What relays may change: the columns they own, and deliver_at (retries and held-back events wait).
RELAY_COLUMNS = (
    "state", "attempts", "last_error", "lease_owner", "claim_token", "lease_expires_at", "published_at", "failed_at",
    "deliver_at",
)  # fmt: skip
#: What a log source relay inserts (relay.sources.log.slot): dead letters of messages and of rows the
#: table no longer holds, and events parked behind a dead letter, each a row of its own.
LOG_RELAY_INSERT_COLUMNS = (
    "id", "topic", "key", "payload", "payload_bytes", "content_type", "headers", "idempotency_key", "created_at",
    "state", "attempts", "last_error", "failed_at",
)  # fmt: skip


def create_roles(dsn: str, table: TableName, *, relay_role: str, writer_role: str, log_source: bool = False) -> None:
    """Create (if missing) a relay role and a writer role with the least they need, column by column.

    A writer may insert the application's columns (:data:`WRITER_COLUMNS`) and
    read ``idempotency_key``, which ``ON CONFLICT (idempotency_key)`` requires,
    and ask whether a taken key holds an event of its topic (the
    table's ``same_event`` function, migration 0005); nothing else. The relay
    reads and deletes rows, updates only the columns it owns
    (:data:`RELAY_COLUMNS`), and reads the schema version. Any other privilege
    the two roles held on the table, its schema-version table and its id
    sequence is revoked first, so running this again tightens the
    table-wide grants of earlier versions. A role that is a superuser, may act
    as the table's owner or as the other role, or still has more than it needs
    through PUBLIC or a role it inherits from is refused, and nothing changes.
    Both roles are NOLOGIN: grant them to your login users. With ``log_source``
    (``--source log``) the relay may also insert rows (:data:`LOG_RELAY_INSERT_COLUMNS`);
    the REPLICATION attribute it needs is not passed on by membership, so it
    is the login user's to have (docs/log-source.md).
    """
    ids = named.identifiers(table)

    def columns(names: tuple[str, ...]) -> sql.Composed:
        return sql.SQL(", ").join(map(sql.Identifier, names))

    with translate_errors(dsn, table), psycopg.connect(dsn, **connect_kwargs()) as conn, conn.transaction():
        # One create_roles at a time in a database, whatever the table: two GRANTs on one schema at
        # once fail ("tuple concurrently updated").
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [_LOCK_NAMESPACE + "create_roles"])
        for role in (relay_role, writer_role):
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
            if not exists:
                try:
                    with conn.transaction():  # a savepoint: roles are the cluster's, and no lock here covers them
                        conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
                except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                    pass  # a migrate in another database made it meanwhile
        names = {key: ids[key].as_string(conn) for key in ("table", "version_table")}
        privileges.refuse_unfit(conn, names["table"], {"--relay-role": relay_role, "--writer-role": writer_role})
        relay, writer = sql.Identifier(relay_role), sql.Identifier(writer_role)
        # The schema the table is in, not the one its name suggests: an unqualified name is
        # found through search_path, which may lead elsewhere than public.
        row = conn.execute(
            "SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE c.oid = %s::regclass",
            [".".join(f'"{part}"' for part in table.parts)],
        ).fetchone()
        schema = sql.Identifier(str(row[0])) if row else ids["schema"]
        for statement in (
            # Revoking a table privilege revokes it on every column too.
            "REVOKE ALL ON {table}, {version_table} FROM {relay}, {writer}",
            "GRANT USAGE ON SCHEMA {schema} TO {relay}, {writer}",
            "GRANT SELECT, DELETE ON {table} TO {relay}",
            "GRANT UPDATE ({relay_columns}) ON {table} TO {relay}",
            "GRANT SELECT ON {version_table} TO {relay}",
            "GRANT INSERT ({writer_columns}) ON {table} TO {writer}",
            "GRANT SELECT (idempotency_key) ON {table} TO {writer}",
            # publish()'s question when its idempotency key is taken (migration 0005).
            "GRANT EXECUTE ON FUNCTION {same_event_func}(text, text) TO {writer}",
            *(["GRANT INSERT ({log_relay_columns}) ON {table} TO {relay}"] if log_source else []),
        ):
            conn.execute(
                sql.SQL(statement).format(
                    relay=relay,
                    writer=writer,
                    relay_columns=columns(RELAY_COLUMNS),
                    writer_columns=columns(WRITER_COLUMNS),
                    log_relay_columns=columns(LOG_RELAY_INSERT_COLUMNS),
                    **{**ids, "schema": schema},
                )
            )
        sequence = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE c.oid = pg_get_serial_sequence(%s, 'id')::regclass",
            [names["table"]],
        ).fetchone()
        if sequence:  # writers draw identity values without a grant on it (docs/operations.md)
            conn.execute(
                sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}, {}").format(sql.Identifier(*sequence), relay, writer)
            )
        privileges.refuse_excess(
            conn,
            relay_role,
            table=names["table"],
            version_table=names["version_table"],
            allowed={
                "SELECT": None,
                "DELETE": None,
                "UPDATE": frozenset(RELAY_COLUMNS),
                **({"INSERT": frozenset(LOG_RELAY_INSERT_COLUMNS)} if log_source else {}),
            },
            version_table_allowed=frozenset({"SELECT"}),
        )
        privileges.refuse_excess(
            conn,
            writer_role,
            table=names["table"],
            version_table=names["version_table"],
            allowed={"INSERT": frozenset(WRITER_COLUMNS), "SELECT": frozenset({"idempotency_key"})},
        )
        logger.info("granted roles %s and %s", relay_role, writer_role, extra={"action": "create_roles"})
