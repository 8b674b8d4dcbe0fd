"""Claims skip rows another transaction has locked instead of waiting for them."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import producers
from relay.store.base import Claim
from relay.store.postgres import PostgresStore
from tests.relay_support import opened_store

# Far longer than a claim of three rows takes, far shorter than the store's own timeouts.
CLAIM_BOUND_SECONDS = 2.0


async def bounded_claim(store: PostgresStore) -> Claim:
    try:
        async with asyncio.timeout(CLAIM_BOUND_SECONDS):
            return await store.claim(10, max_attempts=5)
    except TimeoutError:
        pytest.fail("the claim waited for the locked row instead of skipping it")


def test_a_claim_skips_a_row_locked_by_another_transaction(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for name in ("oldest", "second", "third"):
            with conn.transaction():
                producers.publish(conn, "t", {}, idempotency_key=name)

    async def scenario() -> tuple[Claim, Claim]:
        async with opened_store(database_url) as store:
            with psycopg.connect(database_url) as locker:
                # An open transaction holding the oldest pending row, as a slow
                # producer's UPDATE or another relay's claim would.
                locker.execute("SELECT id FROM outbox WHERE idempotency_key = 'oldest' FOR UPDATE")
                while_locked = await bounded_claim(store)
                locker.rollback()
            return while_locked, await bounded_claim(store)

    while_locked, after = asyncio.run(scenario())
    assert [e.idempotency_key for e in while_locked.events] == ["second", "third"]
    assert [(e.idempotency_key, e.attempts) for e in after.events] == [("oldest", 1)]
