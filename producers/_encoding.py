"""Payload values JSON cannot encode (``Decimal``, ``datetime``, ``UUID``, ...): an error that names
the value's type and place and says what to do, and the ``json_default`` hook that encodes them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from psycopg.adapt import PyFormat
from psycopg.types.json import Jsonb

_SCALARS = (str, int, float, bool, type(None))

REMEDY = (
    "convert it before publishing (str(value) for a Decimal or a UUID, value.isoformat() for a datetime), "
    "or pass json_default=str (any function that turns such a value into one JSON can encode)"
)


def first_unencodable(value: Any, where: str = "payload") -> tuple[str, str] | None:
    """Where in ``value`` the first value JSON cannot encode is, and its type name; None if there is none."""
    stack = [(where, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            for name, child in reversed(item.items()):
                if not isinstance(name, _SCALARS):
                    return f"{path} (a key)", type(name).__name__
                stack.append((f"{path}[{name!r}]", child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{i}]", child) for i, child in reversed(list(enumerate(item))))
        elif not isinstance(item, _SCALARS):
            return path, type(item).__name__
    return None


def unencodable_error(value: Any, what: str) -> TypeError:
    """The ``TypeError`` for a ``value`` that JSON cannot encode."""
    found = first_unencodable(value, what)
    if found is None:
        return TypeError(f"{what} cannot be written as JSON: {REMEDY}")
    path, name = found
    return TypeError(f"{path} is a {name}, which JSON cannot encode: {REMEDY}")


def encoded(value: Any, default: Callable[[Any], Any], what: str) -> Any:
    """``value`` with what JSON cannot encode replaced by ``default`` (as ``json.dumps(default=...)``),
    as plain JSON values: every database and check downstream sees what will be stored."""
    try:
        return json.loads(json.dumps(value, default=default))
    except TypeError:  # default gave up on a value (raised TypeError) or returned one JSON cannot encode
        raise unencodable_error(value, what) from None


def check_connection_encodes(conn: Any, value: Any, what: str) -> None:
    """Refuse, before any SQL, a ``value`` that neither ``json`` nor ``conn``'s own JSON dumper
    (psycopg's ``set_json_dumps``) can encode; psycopg raised a bare ``TypeError`` from inside."""
    connection_json(conn, value, what)


def connection_json(conn: Any, value: Any, what: str) -> str:
    """``value`` as ``conn``'s own JSON dumper writes it for a jsonb parameter; the ``TypeError`` naming
    the value if it cannot."""
    try:
        dumped = conn.adapters.get_dumper(Jsonb, PyFormat.TEXT)(Jsonb, conn).dump(Jsonb(value))
    except TypeError:
        raise unencodable_error(value, what) from None
    return bytes(dumped).decode()
