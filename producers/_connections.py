"""What ``publish`` is given to write on, checked before any SQL: a connection (not a pool, a
server-side or raw cursor), a UTF8 database, and a transaction (a connection in autocommit mode gets an
:class:`AutocommitWarning`)."""

from __future__ import annotations

import warnings
from typing import Any

import psycopg

from producers import _mysql
from producers._errors import AutocommitWarning


def _check_encoding(conn: Any) -> None:
    """``ValueError``, before any SQL, unless the database is UTF8: on SQL_ASCII each writer's
    client encoding decides the bytes stored (one key, two spellings), and on LATIN1 and the like
    jsonb refuses the escapes of non-ASCII text, failing the caller's transaction."""
    # The libpq connection's own report (conn.info would build a ConnectionInfo, and decode the name,
    # on every publish); a cursor writes on its connection's.
    pgconn = getattr(conn, "pgconn", None) or getattr(getattr(conn, "connection", None), "pgconn", None)
    encoding = pgconn.parameter_status(b"server_encoding") if isinstance(pgconn, psycopg.pq.PGconn) else None
    if encoding is not None and encoding != b"UTF8":
        raise ValueError(f"the database is encoded in {encoding.decode()}: the outbox needs a UTF8 database")


#: Cursors the INSERT cannot run on: a server-side cursor would DECLARE it (a syntax error that fails
#: the caller's transaction), a raw one takes no named parameters.
_UNFIT_CURSORS = (psycopg.ServerCursor, psycopg.AsyncServerCursor, psycopg.RawCursor, psycopg.AsyncRawCursor)
_RAW_CURSORS = (psycopg.RawCursor, psycopg.AsyncRawCursor)
_IDLE = psycopg.pq.TransactionStatus.IDLE


def _unfit_for_insert(conn: Any) -> bool:
    """Check ``conn`` before any SQL; True if it is a connection whose cursors are raw ones, so that
    the INSERT must run on a cursor of its own."""
    if isinstance(conn, _UNFIT_CURSORS):
        raise TypeError(f"publish() takes a connection or a client-side cursor, not a {type(conn).__name__}")
    _check_encoding(conn)
    factory = getattr(conn, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, _RAW_CURSORS)


def _refuse_what_is_no_connection(conn: Any, function: str) -> None:
    """``TypeError``, before any SQL, for what the INSERT cannot run on (a pool, a MySQL cursor, None),
    the same on every driver; they failed with an ``AttributeError`` from deep inside."""
    if _mysql.is_either(conn):
        usable = _mysql.is_connection(conn)
    else:
        usable = callable(getattr(conn, "execute", None))  # a psycopg connection or cursor, or one alike
    if not usable:
        name = type(conn).__name__
        hint = ": take a connection from the pool" if "pool" in name.lower() else ""
        raise TypeError(f"{function}() takes a connection, not {name}{hint}")


def _warn_autocommit(conn: Any, function: str, allow_autocommit: bool) -> None:
    """Warn (:class:`AutocommitWarning`), before any SQL, for a connection in autocommit mode outside a
    transaction: the INSERT commits at once, on its own, whatever becomes of the caller's business writes.

    A warning and not an error: code that publishes so on purpose (a script, a backfill, tests of
    earlier releases) keeps working; ``allow_autocommit=True`` says it is on purpose and silences it.
    """
    if allow_autocommit:
        return
    if _mysql.is_either(conn):
        alone = _mysql.commits_each_statement(conn)
    else:
        owner = getattr(conn, "connection", conn)  # a cursor writes on its connection
        alone = False
        if getattr(owner, "autocommit", False) is True:  # first: most are not, and need no ConnectionInfo built
            info = getattr(owner, "info", None)
            alone = isinstance(info, psycopg.ConnectionInfo) and info.transaction_status == _IDLE
    if alone:
        warnings.warn(
            f"{function}() on a connection in autocommit mode outside a transaction commits the event on its "
            "own, apart from the writes it goes with: open a transaction first (psycopg: with conn.transaction(); "
            "PyMySQL: conn.begin()), or pass allow_autocommit=True to publish it on its own on purpose",
            AutocommitWarning,
            stacklevel=3,
        )
