"""How a named query goes to PostgreSQL and how its rows come back: each query with its ``$n``
placeholders made once (:class:`Statement`), ids as one array literal, and rows read by column name."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import pq, sql
from psycopg.abc import Buffer
from psycopg.rows import BaseRowFactory, RowMaker
from psycopg.types.datetime import TimestamptzLoader

R = TypeVar("R")


class AnyTimeLoader(TimestamptzLoader):
    """A ``timestamptz`` as a datetime, or as PostgreSQL's text when no datetime holds it.

    Plain SQL may write ``'infinity'``, ``'-infinity'`` or year 20000 into any
    time column; an operator's ``inspect`` or ``dead`` must still show the row.
    Slower than the built-in loader: for admin commands, not for claims.
    """

    def load(self, data: Buffer) -> datetime | str:  # type: ignore[override]
        try:
            return super().load(data)
        except psycopg.DataError:
            return bytes(data).decode()


_PLACEHOLDER = re.compile(rb"%\((\w+)\)s")


@dataclass(frozen=True, slots=True)
class Statement:
    """A named query as it is sent: PostgreSQL's own ``$n`` placeholders, and the parameters'
    names in their order.

    psycopg turns ``%(name)s`` placeholders into ``$n`` on every execute, a
    regular-expression pass over the text that it caches only for texts under
    4 kB: the claim (5 kB) paid it each time, as much as a tenth of the
    relay's own time per batch at a few hundred events a second. Done once
    here, the statement runs on a raw cursor, which sends it as it is.
    """

    text: bytes
    names: tuple[str, ...]

    @classmethod
    def of(cls, query: sql.Composed) -> Statement:
        names: list[str] = []

        def number(match: re.Match[bytes]) -> bytes:
            name = match.group(1).decode()
            if name not in names:
                names.append(name)
            return b"$%d" % (names.index(name) + 1)

        text = _PLACEHOLDER.sub(number, query.as_bytes(None))
        if b"%" in text:  # only %(name)s placeholders are taken; a literal % would need doubling
            raise ValueError(f"a named query holds a % that is no %(name)s placeholder: {text[:80]!r}")
        return cls(text, tuple(names))

    def values(self, params: Mapping[str, Any] | None) -> list[Any] | None:
        """``params`` in the order of the placeholders (None for a statement that takes none)."""
        if not self.names:
            return None
        assert params is not None, "the statement takes parameters"
        return [params[name] for name in self.names]


def id_array(ids: Iterable[int]) -> str:
    """Event ids as one PostgreSQL array literal, for ``%(ids)s::bigint[]``.

    psycopg adapts a list item by item in Python; a batch's thousand ids cost
    about a millisecond that way, as one string a tenth of that.
    """
    return "{" + ",".join(map(str, ids)) + "}"


def _has_rows(cursor: psycopg.AsyncCursor[Any]) -> bool:
    """Whether the cursor's statement returned rows (a ``SELECT``, a ``RETURNING``); cheaper than
    ``cursor.description``, which builds a column object for each column."""
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def column_index(cursor: psycopg.AsyncCursor[Any]) -> dict[str, int]:
    """Where each column of the cursor's result is, by name (read from the result itself: once per
    claim, ``cursor.description`` built a column object for each column, twice)."""
    result = cursor.pgresult
    if result is None:
        return {}
    # UTF-8: the relay's connections check that the database is UTF8 (check_encoding).
    return {(result.fname(i) or b"").decode(): i for i in range(result.nfields)}


def column_of(name: str, kind: type[R]) -> BaseRowFactory[R]:
    """A row factory that reads each row as the value of its column ``name``."""

    def factory(cursor: Any) -> RowMaker[R]:
        index = [column.name for column in cursor.description or ()].index(name)

        def make(values: Any) -> R:
            value: R = values[index]
            return value

        return make

    return factory
