"""psycopg's errors in the relay's own hierarchy (``StoreUnavailable``, ``SchemaError``, ``ConfigError``,
...), described in one line without any secret of the URL; and the check that the database is UTF8."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import psycopg

from relay.config import TableLayout, TableName, redact_url
from relay.errors import ConfigError, SchemaError, StoreError, StoreReadOnly, StoreUnavailable
from relay.secrets import Scrubber, one_line, secrets_in


def password_of(dsn: str) -> str | None:
    """The password in ``dsn``, so that error messages can be scrubbed of it."""
    return next(iter(secrets_in(dsn)), None)


def describe(exc: BaseException, dsn: str) -> str:
    """A one-line description of a database error with any password removed."""
    return one_line(str(exc).replace(dsn, redact_url(dsn)), Scrubber.of(dsn)) or type(exc).__name__


#: libpq's words for a connection option with a value it cannot take: one it does not know
#: (invalid sslmode value: "x"), no whole number (invalid integer value "x" for connection option
#: "port"), no port (invalid port number: "99999"), or more ports than hosts. No wait mends these.
_BAD_OPTION_VALUE = re.compile(
    r'\binvalid [\w ]+ value: |\binvalid integer value "|\binvalid port number: |\bcould not match \d+ port numbers'
)


def check_encoding(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """``ConfigError`` unless the database is UTF8 (libpq has its encoding already: no round trip).

    On SQL_ASCII, text comes back as bytes and each writer's bytes are stored as
    its client encoding made them (one key, two spellings); on LATIN1 and the
    like, jsonb cannot hold the ``\\uXXXX`` escapes of non-ASCII characters.
    """
    encoding = conn.info.parameter_status("server_encoding")
    if encoding is not None and encoding != "UTF8":
        raise ConfigError(
            f"the database {conn.info.dbname!r} is encoded in {encoding}: the outbox needs a UTF8 database "
            "(CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
        )


@contextlib.contextmanager
def translate_errors(dsn: str, table: TableName, layout: TableLayout | None = None) -> Iterator[None]:
    """Turn psycopg exceptions into the relay's hierarchy, without secrets; with the ``layout``
    the command was given, a missing table or column says which flag may be wrong."""
    try:
        yield
    except psycopg.errors.UndefinedTable:
        hint = ""
        if layout is not None and layout.debezium:
            hint = " (with --table-layout debezium, the relay reads its view over Debezium's table; drop the flag "
            hint += "if the table is the relay's own)"
        raise SchemaError(f"table {table} does not exist: run `outbox-relay migrate` first{hint}") from None
    except psycopg.errors.UndefinedColumn as exc:
        hint = (
            ""
            if layout is None or layout.debezium
            else "; if it is Debezium's outbox table, pass --table-layout debezium"
        )
        raise SchemaError(
            f"table {table} is not an outbox table or is out of date ({exc.diag.message_primary}){hint}"
        ) from None
    except psycopg.ProgrammingError as exc:
        if exc.sqlstate is None:  # libpq refused the URL itself: an unknown parameter or option
            raise ConfigError(f"invalid database URL: {describe(exc, dsn)}") from None
        raise StoreError(describe(exc, dsn)) from exc
    except psycopg.OperationalError as exc:
        if exc.sqlstate is None and _BAD_OPTION_VALUE.search(str(exc)):  # sslmode=bogus, and the like
            raise ConfigError(f"invalid database URL: {describe(exc, dsn)}") from None
        raise StoreUnavailable(describe(exc, dsn)) from exc
    except psycopg.errors.ReadOnlySqlTransaction:
        # A failover's old primary, or a database made read-only for maintenance:
        # unavailable, so the relay waits for writes instead of stopping.
        raise StoreReadOnly(
            "the database is read-only (a hot standby, or default_transaction_read_only is on): writes need the primary"
        ) from None
    except psycopg.Error as exc:
        raise StoreError(describe(exc, dsn)) from exc
