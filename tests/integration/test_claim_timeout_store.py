"""A claim that runs into the statement timeout says so (``ClaimTimeout``), so the relay can claim less."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import producers
from relay.config import TableName
from relay.errors import ClaimTimeout, StoreUnavailable
from relay.store.postgres import PostgresStore


def test_a_claim_past_the_statement_timeout_raises_claim_timeout_and_the_next_one_works(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "t", {}, idempotency_key="waiting")
    store = PostgresStore(
        database_url, TableName.parse("outbox"), owner="t", lease_seconds=30, listen=False, statement_timeout=1.0
    )

    async def scenario() -> None:
        await store.open()
        try:
            # A table lock makes the claim wait until the server ends it, as a claim too big to read in time would.
            with psycopg.connect(database_url) as locker:
                locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(ClaimTimeout, match="claiming up to 10 events"):
                    await store.claim(10, max_attempts=3, max_bytes=1000)
                with pytest.raises(StoreUnavailable) as other:
                    await store.status()  # another statement timing out is no ClaimTimeout
                assert not isinstance(other.value, ClaimTimeout)
            claim = await store.claim(10, max_attempts=3, max_bytes=1000)
            assert [e.idempotency_key for e in claim.events] == ["waiting"]
        finally:
            await store.close()

    asyncio.run(scenario())
