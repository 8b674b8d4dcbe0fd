"""Named SQL, loaded from the ``.sql`` files beside this module.

Queries are ``LiteralString`` templates. The only things filled in are
identifiers derived from a validated :class:`relay.config.TableName`, through
``psycopg.sql``; values always travel as parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import LiteralString

from psycopg import sql

from relay.config import TableName

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
#: The claim's keyset hint (relay/store/floor.py), and the hinted claim's: the
#: same ids, but for each priority seen so far, so that the index scan starts
#: at (priority, floor) instead of reading every index entry below the floor.
_HINT: LiteralString = "AND o.id >= %(after)s"
_HINT_BY_PRIORITY: LiteralString = "AND o.priority = ANY(%(priorities)s::int[]) AND o.id >= %(after)s"
_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")
#: Where a query takes in another named piece of SQL (a fragment two queries share).
_INCLUDE_RE = re.compile(r"/\* include (\w+) \*/")


def _read(path: str) -> LiteralString:
    # The files ship inside the package: their text is as trusted as the code.
    text: LiteralString = resources.files("relay.store").joinpath(path).read_text("utf-8")  # type: ignore[assignment,unused-ignore]
    return text


def read(path: str) -> LiteralString:
    """The text of ``path``, a SQL file of the package ``relay.store``."""
    return _read(path)


def package_files(folder: str) -> list[str]:
    """The names of the files in ``folder`` of the package ``relay.store``."""
    return [entry.name for entry in resources.files("relay.store").joinpath(folder).iterdir()]


def _without_comment_lines(body: LiteralString) -> LiteralString:
    # The comments are for readers of the file. Sent, they would push the
    # statement past track_activity_query_size (1 kB by default), and
    # pg_stat_activity would show a reader of a blocked claim only its comments.
    kept: LiteralString = ""
    for line in body.strip().rstrip(";").splitlines(keepends=True):
        if not line.lstrip().startswith("--"):
            kept += line
    return kept.strip()


@cache
def queries() -> dict[str, LiteralString]:
    """Every named query of ``queries.sql`` (with the pieces it includes), and ``claim_hinted``, from ``claim``."""
    text = _read("queries.sql")
    pieces = _NAME_RE.split(text)
    # split gives [preamble, name1, body1, name2, body2, ...]
    bodies = {name: _without_comment_lines(body) for name, body in zip(pieces[1::2], pieces[2::2], strict=True)}
    # The text comes from the package's own file (see _read): as literal as the code.
    found: dict[str, LiteralString] = {
        name: _INCLUDE_RE.sub(lambda included: bodies[included.group(1)], body) for name, body in bodies.items()
    }
    if found["claim"].count(_HINT) != 1:
        raise RuntimeError(f"queries.sql: the claim must contain {_HINT!r} exactly once")
    found["claim_hinted"] = found["claim"].replace(_HINT, _HINT_BY_PRIORITY)
    return found


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered schema step."""

    version: int
    name: str
    template: LiteralString


@cache
def migrations() -> tuple[Migration, ...]:
    """The numbered migrations, oldest first."""
    found = []
    for entry in resources.files("relay.store").joinpath("migrations").iterdir():
        match = _MIGRATION_RE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), _read(f"migrations/{entry.name}")))
    return tuple(sorted(found, key=lambda m: m.version))


def schema_template() -> LiteralString:
    """The full current schema, as one script."""
    return _read("schema.sql")


def identifiers(table: TableName) -> dict[str, sql.Composable]:
    """The placeholders every template may use, all derived from ``table``."""

    def same_schema(name: str) -> sql.Identifier:
        return sql.Identifier(table.schema, name) if table.schema else sql.Identifier(name)

    return {
        "table": sql.Identifier(*table.parts),
        "version_table": same_schema(table.derived("schema_version")),
        "headers_valid": same_schema(table.derived("headers_valid")),
        "notify_func": same_schema(table.derived("notify")),
        "notify_trigger": sql.Identifier(table.derived("notify")),
        "writer_bounds_func": same_schema(table.derived("writer_bounds")),
        "writer_bounds_trigger": sql.Identifier(table.derived("writer_bounds")),
        "same_event_func": same_schema(table.derived("same_event")),
        "claim_idx": sql.Identifier(table.derived("claim_idx")),
        "key_idx": sql.Identifier(table.derived("key_idx")),
        "failed_idx": sql.Identifier(table.derived("failed_idx")),
        "topic_check": sql.Identifier(table.derived("topic_check")),
        "idempotency_key_check": sql.Identifier(table.derived("idempotency_key_check")),
        "headers_check": sql.Identifier(table.derived("headers_check")),
        "state_check": sql.Identifier(table.derived("state_check")),
        "payload_check": sql.Identifier(table.derived("payload_check")),
        "idempotency_key_unique": sql.Identifier(table.derived("idempotency_key_key")),
        "channel": sql.Literal(table.channel),
        "schema": sql.Identifier(table.schema) if table.schema else sql.SQL("public"),
    }


def render(template: LiteralString, table: TableName) -> sql.Composed:
    """Fill a template's identifiers for ``table``."""
    return sql.SQL(template).format(**identifiers(table))
