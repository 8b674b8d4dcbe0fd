"""The log source's test servers: one embedded PostgreSQL with wal_level=logical per session."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any

import psycopg
import pytest

from devservers.postgres import LOGICAL_DECODING, embedded_postgres
from relay.config import RelaySettings, TableName
from relay.log_relay import LogRelay
from relay.sinks.base import Sink
from relay.sources.log.pgoutput import parse_lsn
from relay.sources.log.publication import prepare
from relay.store.migrate import migrate

TABLE = TableName.parse("outbox")


@pytest.fixture(scope="session")
def logical_server() -> Iterator[str]:
    """The URL of an embedded PostgreSQL 18 with ``wal_level=logical`` (started once a session)."""
    with embedded_postgres(LOGICAL_DECODING) as url:
        yield url


def database_on(server: str, name: str) -> str:
    conninfo = psycopg.conninfo.conninfo_to_dict(server)
    conninfo["dbname"] = name
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in conninfo.items()})


@contextlib.contextmanager
def new_database(server: str, prefix: str = "log") -> Iterator[tuple[str, str]]:
    """A new empty database on ``server`` and a slot name for it, (URL, slot); both dropped after (the slot
    unless a relay still reads it)."""
    suffix = uuid.uuid4().hex[:10]
    name, slot = f"{prefix}_{suffix}", f"slot_{suffix}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_on(server, name), slot
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s"
                " AND active_pid IS NULL",
                [slot],
            )
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def log_database(logical_server: str) -> Iterator[tuple[str, str]]:
    """A new database with the outbox table, its publication and a slot: (URL, slot)."""
    with new_database(logical_server) as (url, slot):
        migrate(url, TABLE)
        prepare(url, TABLE, slot)
        yield url, slot


def settings(**overrides: float) -> RelaySettings:
    values: dict[str, float] = {
        "batch_size": 100, "max_attempts": 3, "backoff_initial_seconds": 0.05, "backoff_max_seconds": 0.2,
        "publish_timeout_seconds": 5.0,
    }  # fmt: skip
    values.update(overrides)
    return RelaySettings(**values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running(url: str, slot: str, sink: Sink, **overrides: float) -> AsyncIterator[LogRelay]:
    """A log relay running until the block ends."""
    relay = LogRelay(url, TABLE, slot, sink, settings(**overrides))
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        yield relay
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def until(predicate: object, timeout: float = 20.0) -> None:
    """Wait until ``predicate()`` is true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.05)


def synchronous(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """An async test run on its own event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def caught_up(url: str, slot: str) -> Callable[[], bool]:
    """A predicate: the slot confirmed everything written before this call."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    written = parse_lsn(row[0])

    def check() -> bool:
        confirmed = confirmed_lsn(url, slot)
        return confirmed is not None and parse_lsn(confirmed) >= written

    return check


def confirmed_lsn(url: str, slot: str) -> str | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", [slot])
        found = row.fetchone()
    return found[0] if found else None
