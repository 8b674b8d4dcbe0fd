"""The log source's publication and slot: what ``migrate --source log --slot NAME`` prepares.

:func:`prepare` creates the publication (INSERTs of the outbox table only; named
as the slot) and the ``pgoutput`` slot, each once, and refuses in one line a
server older than 14, a ``wal_level`` other than ``logical``, and a role that
cannot replicate. On PostgreSQL 15 and later the publication carries a column
list: the table's columns but those the reader never reads (the relay's lease,
retry and timestamp columns), so the server decodes and sends, and the reader
parses, about half the bytes of each row (11 of the native table's 19 columns).
Older servers publish every column; the reader finds its columns by name either way.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
from psycopg import sql

from relay.config import NATIVE, TableLayout, TableName
from relay.errors import ConfigError, StoreUnavailable

MIN_SERVER_VERSION = 140000
#: The first server whose publications take a column list.
COLUMN_LIST_VERSION = 150000
SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
#: The relay's columns the log reader never reads (relay.sources.log.decode and .debezium), per layout:
#: left out of the publication. Every other column is published (a Debezium table's application columns
#: too, since ``--field-header`` may name any of them when the relay runs).
UNREAD_COLUMNS = {
    "native": frozenset({"deliver_at", "priority", "attempts", "lease_owner", "claim_token", "lease_expires_at",
                         "published_at", "failed_at"}),
    "debezium": frozenset({"relay_deliver_at", "relay_priority", "relay_attempts", "relay_lease_owner",
                           "relay_claim_token", "relay_lease_expires_at", "relay_published_at", "relay_failed_at"}),
}  # fmt: skip


def check_slot_name(name: str) -> str:
    """``name`` if PostgreSQL takes it as a replication slot's name (and the publication's)."""
    if not SLOT_NAME.fullmatch(name or ""):
        raise ConfigError(
            f"invalid slot name {name[:80]!r}: 1 to 63 lower-case letters, digits and underscores (--slot, RELAY_SLOT)"
        )
    return name


def publication_name(slot: str) -> str:
    """The publication a slot reads: the slot's own name."""
    return slot


def refusal(version: int, wal_level: str, can_replicate: bool) -> str | None:
    """Why the server cannot host the log source, with what to change; None when it can."""
    if version < MIN_SERVER_VERSION:
        return f"the log source needs PostgreSQL 14 or later (this server is {version // 10000})"
    if wal_level != "logical":
        return (
            f"the log source needs wal_level = logical (it is {wal_level}): set it in postgresql.conf "
            "(or ALTER SYSTEM SET wal_level = logical) and restart the server"
        )
    if not can_replicate:
        return "the log source needs a role with the REPLICATION attribute (ALTER ROLE name REPLICATION) or a superuser"
    return None


def published_columns(version: int, columns: list[str], layout: TableLayout = NATIVE) -> list[str] | None:
    """The publication's column list for a table of ``columns`` (in table order); None for every column
    (a server older than 15, which takes no list)."""
    if version < COLUMN_LIST_VERSION:
        return None
    unread = UNREAD_COLUMNS[layout.name]
    return [column for column in columns if column not in unread]


def _check_server(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT current_setting('server_version_num')::int, current_setting('wal_level'),"
        " (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)"
    ).fetchone()
    assert row is not None
    if why := refusal(row[0], row[1], bool(row[2])):
        raise ConfigError(why)
    return int(row[0])


def check_server(dsn: str) -> None:
    """Raise :class:`ConfigError` (one line, what to change) unless the server can host the log source."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _check_server(conn)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach the database: {exc}") from None


def prepare(dsn: str, table: TableName, slot: str, *, layout: TableLayout = NATIVE, races_left: int = 2) -> list[str]:
    """Create the publication and the slot if missing, and set the publication's columns; what was
    created or changed. Safe to run twice."""
    check_slot_name(slot)
    created: list[str] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            # Migrates of one slot at once take turns (held to the session's end): DDL on one publication
            # from two sessions fails with "tuple concurrently updated". The two-key form is a space of its own,
            # apart from the leader's lock.
            conn.execute("SELECT pg_advisory_lock(hashtext('outbox_relay.migrate'), hashtext(%s))", [slot])
            version = _check_server(conn)
            publication = publication_name(slot)
            schema, name = _schema_and_name(conn, table)
            columns = published_columns(version, _table_columns(conn, schema, name), layout)
            target: sql.Composable = sql.Identifier(schema, name)
            if columns is not None:
                target = sql.SQL("{} ({})").format(target, sql.SQL(", ").join(map(sql.Identifier, columns)))
            found = conn.execute("SELECT pubinsert FROM pg_publication WHERE pubname = %s", [publication]).fetchone()
            if found is None:
                conn.execute(
                    sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')").format(
                        sql.Identifier(publication), target
                    )
                )
                created.append(f"publication {publication}")
            else:
                _update_publication(conn, publication, schema, name, target, columns, created)
            exists = conn.execute(
                "SELECT plugin, database, current_database() FROM pg_replication_slots WHERE slot_name = %s", [slot]
            ).fetchone()
            if exists is not None and exists[1] != exists[2]:
                raise ConfigError(f"slot {slot} belongs to the database {exists[1]}: choose another --slot")
            if exists is None:
                handed = _create_slot(conn, layout.relation(table), slot)
                created.append(f"slot {slot}")
                if handed:
                    created.append(f"{handed} events written before the slot, handed over to the table")
            elif exists[0] != "pgoutput":
                raise ConfigError(
                    f"slot {slot} exists with the plugin {exists[0]}, not pgoutput: choose another --slot"
                )
    except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
        # Another migrate created the publication (a race on the catalog's unique index) or the slot meanwhile:
        # once more, which finds them. A migrate may lose both races, one after the other.
        if races_left <= 0:
            raise
        return prepare(dsn, table, slot, layout=layout, races_left=races_left - 1)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot reach the database: {exc}") from None
    return created


def _create_slot(conn: psycopg.Connection[Any], relation: TableName, slot: str) -> int:
    """Make ``slot`` and hand the rows pending then over to the table (:func:`hand_over_backlog`); how many.

    The slot is made first as this session's temporary slot, and copied to its name (from the same
    position) only once the hand-over is done: a migrate cut off halfway (a lost connection, a stop
    during a big backlog's hand-over) leaves no slot, so the next migrate makes it and hands over again,
    instead of finding the slot there and leaving the rest of the backlog in the table for good.
    """
    temporary = f"outbox_relay_new_{uuid.uuid4().hex[:24]}"
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', true)", [temporary])
    handed = hand_over_backlog(conn, relation, slot)
    conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s, false)", [temporary, slot])
    conn.execute("SELECT pg_drop_replication_slot(%s)", [temporary])
    return handed


#: A row pending when its slot was made, handed over to the table: what its last_error says.
BEFORE_SLOT = "written before the slot {slot} was made, which never streams it: delivered from the table"
#: Rows handed over in one short transaction.
HAND_OVER_ROWS = 10_000


def hand_over_backlog(conn: psycopg.Connection[Any], relation: TableName, slot: str) -> int:
    """Hand the events pending when ``slot`` was made over to the table, as the log relay hands over a parked
    event: the slot streams what commits after it was made, never these, and the leader's sweep delivers
    rows handed over (its keys parked until they are gone, so a key's later events wait behind them). How many.

    Every row committed before the slot was made is visible here (the slot waits for the transactions that
    ran when it was asked for). A row committed since, and handed over too, is streamed as well: a copy,
    never a loss. Up to the highest id now, in short transactions (a writer's new rows are not touched)."""
    target = sql.Identifier(*relation.parts)
    upto = conn.execute(sql.SQL("SELECT max(id) FROM {}").format(target)).fetchone()
    if upto is None or upto[0] is None:
        return 0
    step = sql.SQL(
        "UPDATE {t} SET last_error = %(reason)s WHERE id IN ("
        "SELECT id FROM {t} WHERE (%(after)s::bigint IS NULL OR id > %(after)s::bigint) AND id <= %(upto)s"
        " AND state = 'pending' AND last_error IS NULL"
        " ORDER BY id LIMIT %(limit)s) RETURNING id"
    ).format(t=target)
    params = {"reason": BEFORE_SLOT.format(slot=slot), "after": None, "upto": upto[0], "limit": HAND_OVER_ROWS}
    handed = 0
    while ids := [row[0] for row in conn.execute(step, params).fetchall()]:
        handed += len(ids)
        params["after"] = max(ids)
    return handed


def _update_publication(
    conn: psycopg.Connection[Any], publication: str, schema: str, name: str, target: sql.Composable,
    columns: list[str] | None, created: list[str],
) -> None:  # fmt: skip
    """Add the table to an existing publication, or give it the wanted columns (a publication made before
    the column list, or before a migration that added columns); and publish inserts only."""
    ident = sql.Identifier(publication)
    has = conn.execute(
        "SELECT attnames FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s"
        if columns is not None
        else "SELECT NULL FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        [publication, schema, name],
    ).fetchone()
    if has is None:
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(ident, target))
        created.append(f"table {schema}.{name} in publication {publication}")
    elif columns is not None and list(has[0]) != columns:
        with conn.transaction():  # the table leaves and comes back with its columns in one commit
            conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(ident, sql.Identifier(schema, name)))
            conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(ident, target))
        created.append(f"column list of {schema}.{name} in publication {publication}")
    conn.execute(sql.SQL("ALTER PUBLICATION {} SET (publish = 'insert')").format(ident))


def _table_columns(conn: psycopg.Connection[Any], schema: str, name: str) -> list[str]:
    rows = conn.execute(
        "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped"
        " AND a.attgenerated = ''"  # a generated column is never published (PostgreSQL 15 to 17 refuse one)
        " ORDER BY a.attnum",
        [schema, name],
    ).fetchall()
    return [row[0] for row in rows]


def _schema_and_name(conn: psycopg.Connection[Any], table: TableName) -> tuple[str, str]:
    if len(table.parts) == 2:
        return table.parts[0], table.parts[1]
    row = conn.execute(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
        [str(table)],
    ).fetchone()
    return (row[0] if row else "public"), table.parts[-1]
