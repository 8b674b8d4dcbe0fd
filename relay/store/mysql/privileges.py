"""What ``migrate --create-roles`` checks on MySQL and MariaDB after its grants.

``REVOKE ALL PRIVILEGES ON`` the table takes back only what was granted on the
table: a role that also holds privileges on every table (``ON *.*``), on the
table's database (``ON shop.*``), through a role granted to it, or through
PUBLIC (MariaDB 10.11) keeps them. Such a role is refused instead of being
reported as least privilege.
"""

from __future__ import annotations

import re
from typing import Any

import pymysql

from relay.errors import SchemaError

#: ``GRANT privileges ON target TO grantee``; a role granted to another reads ``GRANT `r` TO `x```.
_PRIVILEGE_GRANT = re.compile(r"^GRANT (?P<privileges>.+?) ON (?P<target>\S+) TO `?(?P<grantee>[^`]*?)`?(?:@|\s|$)")
_ROLE_GRANT = re.compile(r"^GRANT (?P<roles>`.+?) TO `(?P<grantee>[^`]*)`")
_NAME = re.compile(r"`([^`]*)`(?:@`[^`]*`)?")
_TARGET = re.compile(r"^(?:`(?P<database>[^`]*)`|\*)\.(?:`(?P<table>[^`]*)`|\*)$")
#: PUBLIC is no role to ask about on MySQL and older MariaDB (1141, 1959: no such grant, invalid role).
_NO_PUBLIC = (1064, 1141, 1959)


#: What a role may hold on a table: a privilege and the columns it may have (``None``: all of them).
Allowed = dict[str, dict[str, frozenset[str] | None]]
_ITEM = re.compile(r"\s*(?P<privilege>[A-Z ]+?)\s*(?:\((?P<columns>[^)]*)\))?\s*(?:,|$)")


def _beyond(privileges: str, allowed: dict[str, frozenset[str] | None]) -> str:
    """The items of a grant's privilege list (``SELECT, UPDATE (`a`, `b`)``) that ``allowed`` lacks."""
    extra = []
    for item in _ITEM.finditer(privileges):
        privilege, columns = item.group("privilege"), item.group("columns")
        if not privilege:
            continue
        permitted = allowed.get(privilege, frozenset())
        named = _NAME.findall(columns) if columns is not None else None
        if permitted is None or (named is not None and set(named) <= permitted):
            continue
        extra.append(item.group(0).strip().rstrip(",").strip())
    return ", ".join(extra)


def excess(cur: Any, role: str, *, database: str, allowed: Allowed) -> list[str]:
    """What ``role`` may do on ``database``'s tables beyond ``allowed`` (``{table: {privilege: columns}}``),
    counting grants on every table or the whole database, and those of PUBLIC and of roles granted to it."""
    found: dict[str, None] = {}  # in order, once: MariaDB shows a granted role's grants with the role's own
    seen: set[str] = set()
    pending = [role, "PUBLIC"]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            cur.execute(f"SHOW GRANTS FOR `{name}`" if name != "PUBLIC" else "SHOW GRANTS FOR PUBLIC")
        except pymysql.MySQLError as exc:
            if name == "PUBLIC" and exc.args[0] in _NO_PUBLIC:
                continue
            raise
        for (line,) in cur.fetchall():
            privilege = _PRIVILEGE_GRANT.match(line)
            if privilege is None:
                granted = _ROLE_GRANT.match(line)
                if granted is not None:
                    pending.extend(_NAME.findall(granted.group("roles")))
                continue
            target = _TARGET.match(privilege.group("target"))
            if target is None or privilege.group("privileges") in ("USAGE", "PROXY"):
                continue
            where, which = target.group("database"), target.group("table")
            if where is not None and not _matches(cur, database, where, pattern=which is None):
                continue
            if which is not None and which not in allowed:
                continue  # another table's
            extra = _beyond(privilege.group("privileges"), allowed[which]) if which else privilege.group("privileges")
            if extra:
                holder = "" if privilege.group("grantee") == role else f" (from {privilege.group('grantee')})"
                found[f"{extra} ON {privilege.group('target')}{holder}"] = None
    return list(found)


def _matches(cur: Any, database: str, name: str, *, pattern: bool) -> bool:
    """Whether a grant's database, a ``LIKE`` pattern for a whole database, is ``database``."""
    if not pattern:
        return name == database
    cur.execute("SELECT %s LIKE %s", (database, name))
    return bool(cur.fetchone()[0])


def refuse_excess(cur: Any, role: str, *, database: str, allowed: Allowed) -> None:
    """``SchemaError`` if ``role`` may do more on the outbox than ``allowed``."""
    found = excess(cur, role, database=database, allowed=allowed)
    if found:
        raise SchemaError(
            f"role {role!r} may still do more than it needs: {'; '.join(found)}: revoke that (or the role "
            "granted to it), then run migrate --create-roles again"
        )
