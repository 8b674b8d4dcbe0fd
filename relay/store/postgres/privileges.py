"""What ``migrate --create-roles`` checks on PostgreSQL around its grants.

Its grants are the least each role needs only if nothing else reaches the
table: a role that owns the table (or may act as its owner, or as the other
role) can do anything, and a grant to PUBLIC or to a role it inherits from
adds to what it was given. These checks refuse such roles instead of
reporting least privilege that the database does not enforce.
"""

from __future__ import annotations

from typing import Any

import psycopg

from relay.errors import ConfigError, SchemaError

#: Column privileges, and privileges that exist on the whole table only.
_COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
_TABLE_PRIVILEGES = ("DELETE", "TRUNCATE", "TRIGGER")
_SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")


def refuse_unfit(conn: psycopg.Connection[Any], table: str, roles: dict[str, str]) -> None:
    """``ConfigError`` if a role (``{flag: name}``) is a superuser, or may act as the table's owner or the other role.

    Run before the grants: ``REVOKE ALL`` from the owner would strip the owner's own privileges.
    """
    for flag, role in roles.items():
        row = conn.execute(
            "SELECT r.rolsuper, pg_has_role(r.oid, c.relowner, 'MEMBER'), pg_get_userbyid(c.relowner)"
            " FROM pg_roles AS r, pg_class AS c WHERE r.rolname = %s AND c.oid = %s::regclass",
            [role, table],
        ).fetchone()
        if row is None:
            continue
        superuser, owner, owner_name = row
        if superuser:
            raise ConfigError(f"{flag} {role!r} is a superuser: name a role of its own, and grant it to users")
        if owner:
            raise ConfigError(
                f"{flag} {role!r} owns table {_plain(table)}, or is a member of its owner {owner_name!r}: "
                "name a role of its own, and grant it to users"
            )
        for other_flag, other in roles.items():
            if other != role and _member(conn, role, other):
                raise ConfigError(
                    f"{flag} {role!r} is a member of {other!r} ({other_flag}): it would have both roles' privileges"
                )


def _plain(name: str) -> str:
    """A name as the user wrote it: table names are plain identifiers (``TableName``), quoted here only to be exact."""
    return name.replace('"', "")


def _member(conn: psycopg.Connection[Any], role: str, other: str) -> bool:
    row = conn.execute(
        "SELECT pg_has_role(%s, o.oid, 'MEMBER') FROM pg_roles AS o WHERE o.rolname = %s", [role, other]
    ).fetchone()
    return bool(row and row[0])


def refuse_excess(
    conn: psycopg.Connection[Any],
    role: str,
    *,
    table: str,
    version_table: str,
    allowed: dict[str, frozenset[str] | None],
    version_table_allowed: frozenset[str] = frozenset(),
) -> None:
    """``SchemaError`` naming what ``role`` may do beyond ``allowed``, once the grants are made.

    ``allowed`` maps a column privilege to the columns it may have (``None``: every column) and a
    table privilege to ``None``; anything missing is refused. The check asks the database what the
    role may do, so a grant to PUBLIC, to a role it inherits from, or a predefined role is counted.
    """
    excess: list[str] = []
    columns = conn.execute(
        "SELECT a.attname, p.privilege, has_column_privilege(%s, a.attrelid, a.attname, p.privilege)"
        " FROM pg_attribute AS a, unnest(%s::text[]) AS p(privilege)"
        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [role, list(_COLUMN_PRIVILEGES), table],
    ).fetchall()
    beyond: dict[str, list[str]] = {}
    for column, privilege, granted in columns:
        wanted = privilege in allowed and (allowed[privilege] is None or column in (allowed[privilege] or ()))
        if granted and not wanted:
            beyond.setdefault(privilege, []).append(column)
    excess.extend(f"{privilege} ({', '.join(names)}) on {_plain(table)}" for privilege, names in beyond.items())
    table_allowed = frozenset(privilege for privilege in allowed if privilege in _TABLE_PRIVILEGES)
    for name, privileges, permitted in (
        (table, _TABLE_PRIVILEGES, table_allowed),
        (version_table, (*_COLUMN_PRIVILEGES, *_TABLE_PRIVILEGES), version_table_allowed),
    ):
        for privilege in privileges:
            row = conn.execute("SELECT has_table_privilege(%s, %s::regclass, %s)", [role, name, privilege]).fetchone()
            if row and row[0] and privilege not in permitted:
                excess.append(f"{privilege} on {_plain(name)}")
    sequence = conn.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table]).fetchone()
    if sequence and sequence[0]:
        for privilege in _SEQUENCE_PRIVILEGES:
            row = conn.execute("SELECT has_sequence_privilege(%s, %s, %s)", [role, sequence[0], privilege]).fetchone()
            if row and row[0]:
                excess.append(f"{privilege} on {_plain(sequence[0])}")
    if excess:
        raise SchemaError(
            f"role {role!r} may still do more than it needs: {'; '.join(excess)}; it comes from a grant to "
            "PUBLIC or to a role it is a member of: revoke that, then run migrate --create-roles again"
        )
