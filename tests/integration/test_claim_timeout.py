"""A backlog of multi-MB payloads that a full claim cannot read within the statement timeout still drains.

The relay runs in-process with the memory sink; the store is PostgreSQL, with
its statement timeout cut to a quarter of what a full claim of the backlog
takes here (measured first, so the test holds on a fast or a busy machine).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import replace

import psycopg
import pytest

from relay.config import TableName
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store import postgres
from tests.relay_support import opened_store
from tests.unit.test_loop import FAST, run_until

EVENTS = 24
PAYLOAD_BYTES = 1_000_000


def insert_backlog(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        for _ in range(EVENTS):
            # Random hex: TOAST cannot compress it, so reading it costs what its size says.
            payload = json.dumps(os.urandom(PAYLOAD_BYTES // 2).hex())
            conn.execute("INSERT INTO outbox (topic, payload) VALUES ('big', %s::jsonb)", (payload,))


async def full_claim_seconds(database_url: str) -> float:
    """How long one claim of the whole backlog takes (it is released again at once)."""
    async with opened_store(database_url) as store:
        started = time.perf_counter()
        claim = await store.claim(EVENTS, max_attempts=5)
        took = time.perf_counter() - started
        assert len(claim.events) == EVENTS
        await store.release(claim, [e.id for e in claim.events])
    return took


@pytest.mark.timeout(120)
def test_claims_that_hit_the_statement_timeout_shrink_until_the_backlog_drains(database_url: str) -> None:
    insert_backlog(database_url)
    statement_timeout = max(0.05, asyncio.run(full_claim_seconds(database_url)) / 4)
    store = postgres.PostgresStore(
        database_url,
        TableName.parse("outbox"),
        owner="t",
        lease_seconds=60,
        listen=False,
        statement_timeout=statement_timeout,
    )
    sink = MemorySink()
    settings = replace(FAST, batch_size=EVENTS, lease_seconds=60, publish_timeout_seconds=5)
    asyncio.run(run_until(Relay(store, sink, settings), lambda: len(sink.delivered) == EVENTS, timeout=45))
    # Timed-out claims rolled back: no attempt spent, each event delivered once.
    assert sorted(e.id for e in sink.delivered) == sorted({e.id for e in sink.delivered})
    assert all(e.attempts == 1 for e in sink.delivered)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
