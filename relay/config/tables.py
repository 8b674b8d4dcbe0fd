"""The outbox table the relay reads: its validated name, and its layout (the relay's own or Debezium's).

Names are plain identifiers only, so that they can be quoted with
``psycopg.sql.Identifier`` and never need escaping.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from relay.errors import ConfigError

DEFAULT_TABLE = "outbox"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE_RE = re.compile(rf"^(?:({_IDENT})\.)?({_IDENT})$")
#: The same without the length limit, so that a name too long is told so, not that its characters are wrong.
_LONG_TABLE_RE = re.compile(r"^(?:([A-Za-z_][A-Za-z0-9_]*)\.)?([A-Za-z_][A-Za-z0-9_]*)$")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The longest identifier PostgreSQL keeps whole (NAMEDATALEN - 1; MySQL's is 64).
MAX_IDENTIFIER_CHARS = 63
#: The longest table name: the names of its indexes and constraints are the
#: name, ``_`` and a suffix, cut at 63 characters (PostgreSQL's limit; MySQL's
#: is 64), and past 45 two of them come out the same (``_idempotency_key_check``
#: and ``_idempotency_key_key``), which ``migrate`` cannot create.
MAX_TABLE_NAME_CHARS = 45


@dataclass(frozen=True, slots=True)
class TableName:
    """A validated, optionally schema-qualified outbox table name.

    Only plain identifiers are accepted (letters, digits, underscores), so the
    name can be quoted with ``psycopg.sql.Identifier`` and never needs escaping.
    """

    schema: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """Validate ``schema.table`` or ``table``; raise ``ConfigError`` otherwise."""
        match = _TABLE_RE.match(text) or _LONG_TABLE_RE.match(text)
        if match is not None and len(match.group(1) or "") > MAX_IDENTIFIER_CHARS:
            raise ConfigError(
                f"invalid table name {text[:80]!r}: a schema name has at most {MAX_IDENTIFIER_CHARS} characters"
            )
        if match is None:
            raise ConfigError(
                f"invalid table name {text[:80]!r}: use letters, digits and underscores, "
                "optionally schema-qualified (e.g. events.outbox)"
            )
        if len(match.group(2)) > MAX_TABLE_NAME_CHARS:
            raise ConfigError(
                f"invalid table name {text[:80]!r}: at most {MAX_TABLE_NAME_CHARS} characters after the schema, "
                "so that the names of the table's indexes and constraints stay distinct"
            )
        return cls(schema=match.group(1), name=match.group(2))

    @property
    def parts(self) -> tuple[str, ...]:
        """The identifier parts, for ``psycopg.sql.Identifier(*parts)``."""
        return (self.schema, self.name) if self.schema else (self.name,)

    def derived(self, suffix: str) -> str:
        """A name for an object that belongs to this table (index, trigger, ...)."""
        return f"{self.name}_{suffix}"[:63]

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this table: ``outbox_relay.`` and its name, or a digest of
        the name when that is too long for a channel or not plain (a schema found through search_path).

        Never cut: two tables whose names differ only past the cut would share one.
        """
        readable = f"outbox_relay.{self}"
        if all(_PLAIN.fullmatch(part) for part in self.parts) and len(readable) <= MAX_IDENTIFIER_CHARS:
            return readable
        quoted = ".".join('"' + part.replace('"', '""') + '"' for part in self.parts)
        return "outbox_relay." + hashlib.sha256(quoted.encode()).hexdigest()[:40]

    def __str__(self) -> str:
        return ".".join(self.parts)


#: Debezium's event router's default topic: ``outbox.event.`` and the aggregate type.
DEFAULT_TOPIC_TEMPLATE = "outbox.event.{aggregatetype}"
#: Kafka topic characters, and the one placeholder.
_TOPIC_TEMPLATE_RE = re.compile(r"^(?:[A-Za-z0-9._-]|\{aggregatetype\})+$")
_FIELD_HEADER_RE = re.compile(rf"^({_IDENT})=([^\s=]+)$")
TABLE_LAYOUTS = ("native", "debezium")
#: Headers every record of a Debezium table carries from the row itself: no column may stand in.
DEBEZIUM_RESERVED_HEADERS = ("id", "idempotency-key")


@dataclass(frozen=True, slots=True)
class TableLayout:
    """Which outbox table the relay reads: its own (``native``), or Debezium's.

    A ``debezium`` table has Debezium's outbox columns (``id`` uuid,
    ``aggregatetype``, ``aggregateid``, ``type``, ``payload``); the relay
    publishes each row to ``topic_template`` with ``{aggregatetype}`` filled in,
    keyed by ``aggregateid``, with an ``id`` header, and the columns of
    ``field_headers`` (column, header) as headers too. See docs/debezium.md.
    """

    name: str = "native"
    topic_template: str = DEFAULT_TOPIC_TEMPLATE
    field_headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, name: str, *, topic_template: str | None = None, field_headers: Sequence[str] = ()) -> TableLayout:
        """Validate ``--table-layout``, ``--topic-template`` and ``--field-header COLUMN=HEADER`` values."""
        if name not in TABLE_LAYOUTS:
            raise ConfigError(f"unknown table layout {name[:40]!r}: use native or debezium")
        if name == "native" and (topic_template or field_headers):
            raise ConfigError("--topic-template and --field-header go with --table-layout debezium")
        template = topic_template or DEFAULT_TOPIC_TEMPLATE
        if not _TOPIC_TEMPLATE_RE.match(template) or len(template) > 200:
            raise ConfigError(
                f"invalid topic template {template[:80]!r}: use letters, digits, '.', '_', '-' and {{aggregatetype}}"
            )
        pairs = []
        for text in field_headers:
            match = _FIELD_HEADER_RE.match(text)
            if match is None:
                raise ConfigError(f"invalid field header {text[:80]!r}: use COLUMN=HEADER, e.g. type=eventType")
            if match.group(2).lower() in DEBEZIUM_RESERVED_HEADERS:
                raise ConfigError(
                    f"invalid field header {text[:80]!r}: the header {match.group(2)!r} is the relay's own "
                    "(id is the event id, idempotency-key the key consumers drop duplicates by)"
                )
            pairs.append((match.group(1), match.group(2)))
        return cls(name, template, tuple(pairs))

    @property
    def debezium(self) -> bool:
        """Whether this is Debezium's table layout."""
        return self.name == "debezium"

    def relation(self, table: TableName) -> TableName:
        """What the relay's queries read and update: the table, or for Debezium's layout its view."""
        return TableName(table.schema, table.derived("relay")) if self.debezium else table


NATIVE = TableLayout()
