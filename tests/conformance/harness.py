"""The conformance harness: each test gets every store through one fixture, ``h``.

``h.store`` is the relay's store (the ``Store`` port) and ``h.admin`` the
operator's (the ``Admin`` port): the same object for the memory store, and an
admin of its own for PostgreSQL and MySQL, opened as the CLI opens it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar
from uuid import UUID

import psycopg

import producers
from producers._write import TABLE_MAX_DELIVER_AHEAD
from relay.config import TableName
from relay.store.base import Admin
from relay.store.memory import MemoryStore
from relay.store.mysql import MySQLAdmin, MySQLStore
from relay.store.mysql.admin import NO_LEASE
from relay.store.postgres import PostgresAdmin, PostgresStore
from tests import mysql_support

T = TypeVar("T")
MAX = 3
#: The lease grace ``skip`` is given: as the CLI computes it by default (30 s publish timeout + 10 s).
GRACE = 40.0


#: The event loop of the test under way (set by the ``h`` fixture): one loop per
#: test, as in a relay, since asyncmy's connections belong to the loop that made them.
runner: asyncio.Runner | None = None


def run(coro: Coroutine[Any, Any, T]) -> T:
    return runner.run(coro) if runner is not None else asyncio.run(coro)


def _beyond_the_tables_bound(kw: dict[str, Any]) -> datetime | None:
    """Take out of ``kw`` a ``deliver_at`` further ahead than the table takes (and allow any other): it is
    written afterwards, as a relay's update of an older row may leave it."""
    kw.setdefault("max_deliver_ahead", TABLE_MAX_DELIVER_AHEAD)
    deliver_at = kw.get("deliver_at")
    if isinstance(deliver_at, datetime) and deliver_at - datetime.now(UTC) > TABLE_MAX_DELIVER_AHEAD:
        return kw.pop("deliver_at")  # type: ignore[no-any-return]
    return None


class Harness(Protocol):
    store: Any
    admin: Admin

    def insert(self, topic: str, payload: Any, **kw: Any) -> None: ...
    def insert_sent(self, idem: str, *, key: str | None = None, topic: str = "t", sent_ago: float = 0) -> None: ...
    def expire_leases(self, ago: float = 1, *, idem: str | None = None) -> None: ...
    def make_due(self) -> None: ...
    def state_of(self, idem: str) -> str | None: ...
    def id_of(self, idem: str) -> int: ...
    def snapshot(self, idem: str) -> tuple[Any, ...]: ...
    def created(self, idem: str, ago: float) -> None: ...
    def set_attempts(self, idem: str, attempts: int) -> None: ...
    def fail(self, idem: str, ago: float = 0) -> None: ...
    def states(self) -> dict[str, str]: ...


class MemoryHarness:
    def __init__(self) -> None:
        self.store = MemoryStore(lease_seconds=30)
        self.admin: Admin = self.store

    def insert(self, topic: str, payload: Any, **kw: Any) -> None:
        self.store.insert(topic, payload, **kw)

    def insert_sent(self, idem: str, *, key: str | None = None, topic: str = "t", sent_ago: float = 0) -> None:
        row = self.store.rows[self.store.insert(topic, {}, key=key, idempotency_key=idem)]
        row.state, row.attempts, row.published_at = "sent", 1, self.store.now() - timedelta(seconds=sent_ago)

    def expire_leases(self, ago: float = 1, *, idem: str | None = None) -> None:
        """End every lease (or only event ``idem``'s) ``ago`` seconds back."""
        for row in self.store.rows.values():
            if row.lease_expires_at is not None and idem in (None, row.idempotency_key):
                row.lease_expires_at = self.store.now() - timedelta(seconds=ago)

    def make_due(self) -> None:
        for row in self.store.rows.values():
            row.deliver_at = min(row.deliver_at, self.store.now())

    def state_of(self, idem: str) -> str | None:
        return next((r.state for r in self.store.rows.values() if r.idempotency_key == idem), None)

    def id_of(self, idem: str) -> int:
        return next(r.id for r in self.store.rows.values() if r.idempotency_key == idem)

    def snapshot(self, idem: str) -> tuple[Any, ...]:
        row = next(r for r in self.store.rows.values() if r.idempotency_key == idem)
        return (row.state, row.attempts, row.claim_token, row.lease_expires_at, row.deliver_at, row.last_error)

    def created(self, idem: str, ago: float) -> None:
        """Set the event's created_at ``ago`` seconds back (ahead, if negative), as plain SQL may."""
        row = next(r for r in self.store.rows.values() if r.idempotency_key == idem)
        row.created_at = self.store.now() - timedelta(seconds=ago)

    def set_attempts(self, idem: str, attempts: int) -> None:
        next(r for r in self.store.rows.values() if r.idempotency_key == idem).attempts = attempts

    def states(self) -> dict[str, str]:
        """Every event's state, by idempotency key."""
        return {r.idempotency_key: r.state for r in self.store.rows.values()}

    def fail(self, idem: str, ago: float = 0) -> None:
        """Dead-letter the event ``ago`` seconds back, as plain SQL (or the reaper, behind a key's first) may."""
        row = next(r for r in self.store.rows.values() if r.idempotency_key == idem)
        row.state, row.failed_at, row.last_error = "failed", self.store.now() - timedelta(seconds=ago), "refused"


class PostgresHarness:
    def __init__(self, url: str) -> None:
        self.url = url
        table = TableName.parse("outbox")
        self.store = PostgresStore(url, table, owner="test", lease_seconds=30, listen=False)
        self.admin: Admin = PostgresAdmin(url, table)

    def _execute(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def insert(self, topic: str, payload: Any, **kw: Any) -> None:
        far = _beyond_the_tables_bound(kw)
        with psycopg.connect(self.url) as conn:
            # Any deliver_at, as plain SQL may write it: the store must cope with what publish() refuses.
            written = producers.publish(conn, topic, payload, **kw)
            if far is not None:  # a row from before the table bounded deliver_at (migration 0005)
                conn.execute("UPDATE outbox SET deliver_at = %s WHERE idempotency_key = %s", [far, written])

    def insert_sent(self, idem: str, *, key: str | None = None, topic: str = "t", sent_ago: float = 0) -> None:
        self._execute(
            "INSERT INTO outbox (topic, key, payload, idempotency_key, state, attempts, published_at)"
            " VALUES (%s, %s, '{}', %s, 'sent', 1, now() - make_interval(secs => %s))",
            [topic, key, idem, sent_ago],
        )

    def expire_leases(self, ago: float = 1, *, idem: str | None = None) -> None:
        self._execute(
            "UPDATE outbox SET lease_expires_at = now() - make_interval(secs => %s)"
            " WHERE lease_expires_at IS NOT NULL AND (%s::text IS NULL OR idempotency_key = %s)",
            [ago, idem, idem],
        )

    def make_due(self) -> None:
        self._execute("UPDATE outbox SET deliver_at = now() WHERE deliver_at > now()")

    def state_of(self, idem: str) -> str | None:
        rows = self._execute("SELECT state FROM outbox WHERE idempotency_key = %s", [idem])
        return rows[0][0] if rows else None

    def id_of(self, idem: str) -> int:
        return int(self._execute("SELECT id FROM outbox WHERE idempotency_key = %s", [idem])[0][0])

    def snapshot(self, idem: str) -> tuple[Any, ...]:
        rows = self._execute(
            "SELECT state, attempts, claim_token, lease_expires_at, deliver_at, last_error"
            " FROM outbox WHERE idempotency_key = %s",
            [idem],
        )
        return tuple(rows[0])

    def created(self, idem: str, ago: float) -> None:
        self._execute(
            "UPDATE outbox SET created_at = now() - make_interval(secs => %s) WHERE idempotency_key = %s", [ago, idem]
        )

    def set_attempts(self, idem: str, attempts: int) -> None:
        self._execute("UPDATE outbox SET attempts = %s WHERE idempotency_key = %s", [attempts, idem])

    def states(self) -> dict[str, str]:
        return {str(idem): str(state) for idem, state in self._execute("SELECT idempotency_key, state FROM outbox")}

    def fail(self, idem: str, ago: float = 0) -> None:
        self._execute(
            "UPDATE outbox SET state = 'failed', last_error = 'refused', failed_at = now() - make_interval(secs => %s)"
            " WHERE idempotency_key = %s",
            [ago, idem],
        )


class MySQLHarness:
    """MySQL 8 / MariaDB: events written by ``publish()`` on a PyMySQL connection, the rest in plain SQL."""

    def __init__(self, url: str) -> None:
        self.url = url
        table = TableName.parse("outbox")
        self.store = MySQLStore(url, table, owner="test", lease_seconds=30)
        self.admin: Admin = MySQLAdmin(url, table)

    def _execute(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        return mysql_support.execute(self.url, statement, params)

    def insert(self, topic: str, payload: Any, **kw: Any) -> None:
        far = _beyond_the_tables_bound(kw)
        conn = mysql_support.connect(self.url, autocommit=False)
        try:
            written = producers.publish(conn, topic, payload, **kw)
            if far is not None:  # a row from before the table bounded deliver_at (migration 0005)
                with conn.cursor() as cur:
                    cur.execute(
                        "UPDATE outbox SET deliver_at = %s WHERE idempotency_key = %s",
                        (far.astimezone(UTC).replace(tzinfo=None), written.encode()),
                    )
            conn.commit()
        finally:
            conn.close()

    def insert_sent(self, idem: str, *, key: str | None = None, topic: str = "t", sent_ago: float = 0) -> None:
        self._execute(
            "INSERT INTO outbox (topic, `key`, payload, idempotency_key, state, attempts, published_at)"
            " VALUES (%s, %s, '{}', %s, 'sent', 1, UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND)",
            [topic, key, idem, round(sent_ago * 1e6)],
        )

    def expire_leases(self, ago: float = 1, *, idem: str | None = None) -> None:
        self._execute(
            "UPDATE outbox SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND"
            " WHERE lease_expires_at <> %s AND (%s IS NULL OR idempotency_key = %s)",
            [round(ago * 1e6), NO_LEASE, idem, idem],
        )

    def make_due(self) -> None:
        self._execute("UPDATE outbox SET deliver_at = UTC_TIMESTAMP(6) WHERE deliver_at > UTC_TIMESTAMP(6)")

    def state_of(self, idem: str) -> str | None:
        rows = self._execute("SELECT state FROM outbox WHERE idempotency_key = %s", [idem])
        return rows[0][0] if rows else None

    def id_of(self, idem: str) -> int:
        return int(self._execute("SELECT id FROM outbox WHERE idempotency_key = %s", [idem])[0][0])

    def snapshot(self, idem: str) -> tuple[Any, ...]:
        rows = self._execute(
            "SELECT state, attempts, claim_token, lease_expires_at, deliver_at, last_error"
            " FROM outbox WHERE idempotency_key = %s",
            [idem],
        )
        # As PostgreSQL gives them: the token a UUID, the times aware (the columns hold UTC).
        state, attempts, token, lease_expires_at, deliver_at, last_error = rows[0]
        return (
            state,
            attempts,
            UUID(token) if token else None,
            None if lease_expires_at == NO_LEASE else lease_expires_at.replace(tzinfo=UTC),
            deliver_at.replace(tzinfo=UTC),
            last_error,
        )

    def created(self, idem: str, ago: float) -> None:
        self._execute(
            "UPDATE outbox SET created_at = UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND WHERE idempotency_key = %s",
            [round(ago * 1e6), idem],
        )

    def set_attempts(self, idem: str, attempts: int) -> None:
        self._execute("UPDATE outbox SET attempts = %s WHERE idempotency_key = %s", [attempts, idem])

    def states(self) -> dict[str, str]:
        rows = self._execute("SELECT idempotency_key, state FROM outbox")
        return {idem.decode() if isinstance(idem, bytes) else idem: state for idem, state in rows}

    def fail(self, idem: str, ago: float = 0) -> None:
        self._execute(
            "UPDATE outbox SET state = 'failed', last_error = 'refused',"
            " failed_at = UTC_TIMESTAMP(6) - INTERVAL %s MICROSECOND WHERE idempotency_key = %s",
            [round(ago * 1e6), idem],
        )
