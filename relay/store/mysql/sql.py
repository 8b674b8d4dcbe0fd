"""Named SQL of the MySQL store, loaded from the ``.sql`` files beside this module.

The only things filled in are identifiers derived from a validated
:class:`relay.config.TableName` (letters, digits and underscores only), quoted
with backticks; values always travel as parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

from relay.config import TableName

_NAME_RE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")
#: Statements in a script end with a semicolon at the end of a line.
_STATEMENT_END = re.compile(r";[ \t]*(?:--[^\n]*)?$", re.MULTILINE)


def _read(path: str) -> str:
    # The files ship inside the package: their text is as trusted as the code.
    return resources.files("relay.store.mysql").joinpath(path).read_text("utf-8")


def _without_comment_lines(body: str) -> str:
    return "\n".join(line for line in body.strip().splitlines() if not line.lstrip().startswith("--")).strip()


@cache
def queries() -> dict[str, str]:
    """Every named query of ``queries.sql``, without its comment lines and final semicolon."""
    pieces = _NAME_RE.split(_read("queries.sql"))
    return {
        name: _without_comment_lines(body).rstrip(";").strip()
        for name, body in zip(pieces[1::2], pieces[2::2], strict=True)
    }


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered schema step."""

    version: int
    name: str
    template: str


@cache
def migrations() -> tuple[Migration, ...]:
    """The numbered migrations, oldest first."""
    found = []
    for entry in resources.files("relay.store.mysql").joinpath("migrations").iterdir():
        match = _MIGRATION_RE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), _read(f"migrations/{entry.name}")))
    return tuple(sorted(found, key=lambda m: m.version))


def schema_template() -> str:
    """The full current schema, as one script."""
    return _read("schema.sql")


def quote(name: str) -> str:
    """One identifier in backticks; the names here never hold a backtick (see ``TableName``)."""
    if "`" in name:
        raise ValueError(f"identifier {name!r} holds a backtick")
    return f"`{name}`"


def identifiers(table: TableName) -> dict[str, str]:
    """The placeholders every template may use, all derived from ``table``."""

    def same_schema(name: str) -> str:
        return f"{quote(table.schema)}.{quote(name)}" if table.schema else quote(name)

    return {
        "table": ".".join(map(quote, table.parts)),
        "version_table": same_schema(table.derived("schema_version")),
        "claim_idx": quote(table.derived("claim_idx")),
        "key_idx": quote(table.derived("key_idx")),
        "failed_idx": quote(table.derived("failed_idx")),
        "topic_check": quote(table.derived("topic_check")),
        "idempotency_key_check": quote(table.derived("idempotency_key_check")),
        "key_check": quote(table.derived("key_check")),
        "headers_check": quote(table.derived("headers_check")),
        "state_check": quote(table.derived("state_check")),
        "payload_check": quote(table.derived("payload_check")),
        "idempotency_key_unique": quote(table.derived("idempotency_key_key")),
        "writer_bounds_trigger": same_schema(table.derived("writer_bounds")),
        "same_event_func": same_schema(table.derived("same_event")),
    }


def render(template: str, table: TableName) -> str:
    """Fill a template's identifiers for ``table`` (``{{`` and ``}}`` stand for braces)."""
    return template.format(**identifiers(table))


def statements(script: str) -> list[str]:
    """The statements of a rendered script, comments dropped."""
    parts = _STATEMENT_END.split(script)
    return [text for part in parts if (text := _without_comment_lines(part))]
