"""``process_once`` returns True only when the key and the handler's writes were committed.

A handler that catches a database error leaves the transaction aborted, and
PostgreSQL turns the COMMIT that follows into a silent ROLLBACK; one that ends
the transaction itself leaves nothing to commit. Either way the call must raise,
so the consumer does not move past an event that was never processed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import consumers
from tests.integration.test_inbox import inbox_keys, prepare, side_effects

INSERT = "INSERT INTO side_effects (note) VALUES (%s)"


def swallows_an_error(conn: psycopg.Connection[Any]) -> None:
    conn.execute(INSERT, ["written before the error"])
    # The mistake under test: the error is swallowed and the transaction stays aborted.
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1 / 0")


def swallows_a_constraint_violation(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.errors.NotNullViolation):
        conn.execute(INSERT, [None])


def ends_the_transaction(conn: psycopg.Connection[Any]) -> None:
    conn.execute(INSERT, ["written, then rolled back by the handler"])
    conn.execute("ROLLBACK")


def rolls_back_and_goes_on(conn: psycopg.Connection[Any]) -> None:
    conn.execute("ROLLBACK")  # the key is gone with it ...
    conn.execute(INSERT, ["written in a transaction of its own"])  # ... and this starts another


def rolls_back_and_reads(conn: psycopg.Connection[Any]) -> None:
    conn.execute("ROLLBACK")
    conn.execute("SELECT 1")  # another transaction, with no transaction id yet


BROKEN: dict[str, Callable[[psycopg.Connection[Any]], None]] = {
    "catches a division by zero": swallows_an_error,
    "catches a constraint violation": swallows_a_constraint_violation,
    "ends the transaction itself": ends_the_transaction,
    "rolls back, then writes in a new transaction": rolls_back_and_goes_on,
    "rolls back, then reads in a new transaction": rolls_back_and_reads,
}


@pytest.mark.parametrize("handler", BROKEN.values(), ids=BROKEN.keys())
def test_a_handler_that_leaves_the_transaction_broken_makes_process_once_raise(
    database_url: str, handler: Callable[[psycopg.Connection[Any]], None]
) -> None:
    prepare(database_url)
    with psycopg.connect(database_url) as conn:
        with pytest.raises(consumers.HandlerLeftTransactionBroken):
            consumers.process_once(conn, "k-1", handler, topic="orders")
        assert inbox_keys(database_url) == [] and side_effects(database_url) == []
        # The connection is usable, and the redelivery is processed.
        assert consumers.process_once(conn, "k-1", lambda c: c.execute(INSERT, ["done"])) is True
    assert inbox_keys(database_url) == ["k-1"] and side_effects(database_url) == ["done"]


def test_a_handler_that_commits_itself_is_not_taken_for_success_and_the_error_does_not_lie(database_url: str) -> None:
    prepare(database_url)

    def commits(conn: psycopg.Connection[Any]) -> None:
        conn.execute(INSERT, ["committed by the handler"])
        conn.execute("COMMIT")

    with (
        psycopg.connect(database_url) as conn,
        pytest.raises(consumers.HandlerLeftTransactionBroken, match="may or may not be committed"),
    ):
        consumers.process_once(conn, "k-1", commits)
    # What the handler committed stays committed; the error said it might be.
    assert inbox_keys(database_url) == ["k-1"] and side_effects(database_url) == ["committed by the handler"]


def test_a_handler_that_recovers_with_its_own_savepoint_commits(database_url: str) -> None:
    prepare(database_url)

    def recovers(conn: psycopg.Connection[Any]) -> None:
        conn.execute(INSERT, ["kept"])
        try:
            with conn.transaction():
                conn.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            conn.execute(INSERT, ["after the failed step"])

    with psycopg.connect(database_url) as conn:
        assert consumers.process_once(conn, "k-1", recovers) is True
    assert inbox_keys(database_url) == ["k-1"] and side_effects(database_url) == ["kept", "after the failed step"]


async def aswallows_an_error(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(INSERT, ["written before the error"])
    with contextlib.suppress(psycopg.errors.DivisionByZero):
        await conn.execute("SELECT 1 / 0")


async def aends_the_transaction(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(INSERT, ["written, then rolled back by the handler"])
    await conn.execute("ROLLBACK")


async def arolls_back_and_goes_on(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("ROLLBACK")
    await conn.execute(INSERT, ["written in a transaction of its own"])


ABROKEN: dict[str, Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]] = {
    "catches a division by zero": aswallows_an_error,
    "ends the transaction itself": aends_the_transaction,
    "rolls back, then writes in a new transaction": arolls_back_and_goes_on,
}


@pytest.mark.parametrize("handler", ABROKEN.values(), ids=ABROKEN.keys())
def test_aprocess_once_raises_the_same_way(
    database_url: str, handler: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]
) -> None:
    prepare(database_url)

    async def done(conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(INSERT, ["done"])

    async def scenario() -> bool:
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            with pytest.raises(consumers.HandlerLeftTransactionBroken):
                await consumers.aprocess_once(conn, "a-1", handler)
            assert inbox_keys(database_url) == [] and side_effects(database_url) == []
            return await consumers.aprocess_once(conn, "a-1", done)

    assert asyncio.run(scenario()) is True
    assert inbox_keys(database_url) == ["a-1"] and side_effects(database_url) == ["done"]


def test_a_handler_whose_body_did_not_run_is_not_taken_for_success(database_url: str) -> None:
    """An ``async def`` handler given to the sync ``process_once`` (or a generator function) returns
    without running its body: committing the key then would lose the event."""
    prepare(database_url)

    async def async_handler(conn: Any) -> None:
        await conn.execute(INSERT, ["never written"])

    def generator_handler(conn: psycopg.Connection[Any]) -> Any:
        conn.execute(INSERT, ["never written"])
        yield

    with psycopg.connect(database_url) as conn:
        for handler in (async_handler, generator_handler):
            with pytest.raises(TypeError, match="did not run"):
                consumers.process_once(conn, "k-1", handler)
            assert inbox_keys(database_url) == [] and side_effects(database_url) == []
        assert consumers.process_once(conn, "k-1", lambda c: c.execute(INSERT, ["done"])) is True
    assert inbox_keys(database_url) == ["k-1"] and side_effects(database_url) == ["done"]

    async def returns_what_it_did_not_await(conn: psycopg.AsyncConnection[Any]) -> Any:
        return conn.execute(INSERT, ["never written"])

    async def scenario() -> None:
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            with pytest.raises(TypeError, match="did not run"):
                await consumers.aprocess_once(aconn, "a-1", returns_what_it_did_not_await)

    asyncio.run(scenario())
    assert inbox_keys(database_url) == ["k-1"] and side_effects(database_url) == ["done"]


def test_a_handler_that_does_its_work_and_returns_a_generator_commits(database_url: str) -> None:
    prepare(database_url)

    def returns_a_generator(conn: psycopg.Connection[Any]) -> Any:
        conn.execute(INSERT, ["written"])
        return (note for note in ["a value the caller ignores"])

    with psycopg.connect(database_url) as conn:
        assert consumers.process_once(conn, "k-1", returns_a_generator) is True
    assert inbox_keys(database_url) == ["k-1"] and side_effects(database_url) == ["written"]
