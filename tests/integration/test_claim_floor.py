"""The keyset hint on real PostgreSQL: what a hinted claim skips, a full scan finds."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import uuid4

import psycopg
from psycopg import sql
from psycopg.rows import namedtuple_row

from relay.config import TableName
from relay.store import sql as named
from relay.store.base import Claim
from relay.store.floor import CONFIRM_MARGIN_SECONDS
from relay.store.postgres import PostgresStore
from tests.relay_support import opened_store

INTERVAL = 0.5


def insert(conn: psycopg.Connection[Any], topic: str, key: str | None = None, *, priority: int = 0) -> int:
    row = conn.execute(
        "INSERT INTO outbox (topic, key, payload, priority) VALUES (%s, %s, '{}', %s) RETURNING id",
        [topic, key, priority],
    ).fetchone()
    assert row is not None
    return int(row[0])


def committed(database_url: str, topic: str, key: str | None = None, *, priority: int = 0) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return insert(conn, topic, key, priority=priority)


async def send_all(store: PostgresStore, batch: Claim) -> None:
    """Settle every event of ``batch`` as sent."""
    await store.settle(batch, sent=[e.id for e in batch.events], retry=[], dead=[])


async def next_full_scan(store: PostgresStore, interval: float = INTERVAL) -> Claim:
    """Claim until a claim returns events, which must happen within a few full-scan intervals."""
    started = time.monotonic()
    while True:
        await asyncio.sleep(0.05)
        batch = await store.claim(10, max_attempts=5)
        if batch.events:
            return batch
        assert time.monotonic() - started < interval * 3, "no full scan found the event"


async def claim_each(store: PostgresStore, database_url: str, topics: list[str]) -> None:
    """For each topic: commit an event, claim exactly that event and settle it, then wait three margins."""
    for topic in topics:
        committed(database_url, topic)
        batch = await store.claim(10, max_attempts=5)
        assert [e.topic for e in batch.events] == [topic]
        await send_all(store, batch)
        await asyncio.sleep(CONFIRM_MARGIN_SECONDS * 3)


def test_an_event_committed_late_below_the_floor_is_found_by_the_next_full_scan(database_url: str) -> None:
    # A longer interval than the other tests': the claim after the second full scan must be a hinted
    # one. With 0.5 s, full test runs here failed now and then: that claim found `late`, which only
    # a full scan can (over half a second went by in between, on a busy machine).
    interval = 4 * INTERVAL

    async def scenario() -> None:
        async with opened_store(database_url, full_scan_interval=interval) as store:
            with psycopg.connect(database_url) as slow_writer:
                late = insert(slow_writer, "late")  # takes its id now, commits much later
                committed(database_url, "b1")
                await send_all(store, await store.claim(10, max_attempts=5))  # full scan
                await asyncio.sleep(interval * 1.2)
                committed(database_url, "b2")
                await send_all(store, await store.claim(10, max_attempts=5))  # full scan: the floor is now above `late`
                slow_writer.commit()
            assert store._floor.next_after() != 0, "the next claim is a hinted one"
            hinted = await store.claim(10, max_attempts=5)
            assert hinted.events == []  # below the floor: a hinted claim does not look there
            assert [e.id for e in (await next_full_scan(store, interval)).events] == [late]

    asyncio.run(scenario())


def test_the_next_event_of_a_key_is_claimed_as_soon_as_its_head_is_settled(database_url: str) -> None:
    async def scenario() -> None:
        async with opened_store(database_url, full_scan_interval=INTERVAL) as store:
            head = committed(database_url, "orders", "order-1")
            claimed = await store.claim(10, max_attempts=5)  # full scan; the head stays in flight
            assert [e.id for e in claimed.events] == [head]
            follower = committed(database_url, "orders", "order-1")
            for _ in range(2):  # two more full scans move the floor past the follower
                await asyncio.sleep(INTERVAL * 1.2)
                newer = committed(database_url, "other")
                batch = await store.claim(10, max_attempts=5)
                assert [e.id for e in batch.events] == [newer]  # the follower waits for its head
                await store.settle(batch, sent=[newer], retry=[], dead=[])
            await store.settle(claimed, sent=[head], retry=[], dead=[])
            # Well inside the interval, so a hinted claim: it must reach down to the follower.
            assert [e.id for e in (await store.claim(10, max_attempts=5)).events] == [follower]

    asyncio.run(scenario())


def test_the_floor_trails_the_claims_by_a_moment_while_writers_are_short(database_url: str) -> None:
    async def scenario() -> None:
        # No full scan (one runs at most 10 s apart; this test takes under 3 s) and no floor moved by age.
        async with opened_store(database_url, full_scan_interval=30.0) as store:
            spares = [committed(database_url, "spare") for _ in range(3)]
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", [spares])
            passed = False
            # Three tries: a transaction elsewhere in the cluster, open across the
            # claims, holds the floor back (correctly) and spoils one.
            for spare in spares:
                await claim_each(store, database_url, ["b1", "b2", "b3"])
                with psycopg.connect(database_url, autocommit=True) as conn:  # an id below the claims'
                    conn.execute("INSERT INTO outbox (id, topic, payload) VALUES (%s, 'below', '{}')", [spare])
                found = await store.claim(10, max_attempts=5)
                if not found.events:  # the floor passed it a moment after the claims, not an interval
                    passed = True
                    break
                await send_all(store, found)
            assert passed, "the floor stayed below the claims' ids for every try"

    asyncio.run(scenario())


def test_a_writer_still_open_keeps_the_floor_below_its_event(database_url: str) -> None:
    async def scenario() -> None:
        async with opened_store(database_url, full_scan_interval=30.0) as store:
            with psycopg.connect(database_url) as slow_writer:
                late = insert(slow_writer, "late")  # takes its id (and a transaction id) now, commits later
                await claim_each(store, database_url, ["b1", "b2", "b3"])
                slow_writer.commit()
            # Many margins later, but the writer was running at every claim: the floor is still below it.
            assert [e.id for e in (await store.claim(10, max_attempts=5)).events] == [late]

    asyncio.run(scenario())


#: The claim's parameters for a relay with no batch in flight.
NO_CHAIN: dict[str, list[Any]] = {"mine": [], "tail_keys": [], "tail_ids": [], "tail_topics": []}


def claim_statement(name: str, after: int, priorities: list[int]) -> tuple[sql.Composed, dict[str, Any]]:
    """One of the store's claim statements, by name, and its parameters."""
    query = named.render(named.queries()[name], TableName.parse("outbox"))
    params = {"after": after, "priorities": priorities, "limit": 10, "max_bytes": 2**62, "max_attempts": 5,
              "token": uuid4(), "owner": "t", "lease_seconds": 30, **NO_CHAIN}  # fmt: skip
    return query, params


def run_claim(conn: psycopg.Connection[Any], name: str, after: int, priorities: list[int]) -> list[Any]:
    """Run a claim statement in a transaction rolled back afterwards; its rows in claim order, as the store sorts them
    (RETURNING follows no order)."""
    query, params = claim_statement(name, after, priorities)
    with conn.transaction(force_rollback=True):
        rows = conn.cursor(row_factory=namedtuple_row).execute(query, params).fetchall()
    return sorted(rows, key=lambda row: (-row.priority, row.id))


def test_a_hinted_claim_looks_only_at_the_priorities_it_is_given(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        floor = insert(conn, "below")
        plain = insert(conn, "plain")
        urgent = insert(conn, "urgent", priority=7)
        assert [r[0] for r in run_claim(conn, "claim_hinted", floor + 1, [0])] == [plain]
        assert [r[0] for r in run_claim(conn, "claim_hinted", floor + 1, [0, 7])] == [urgent, plain]
        assert [r[0] for r in run_claim(conn, "claim", 0, [])] == [urgent, floor, plain]  # a full scan


def test_a_hinted_claim_does_not_read_the_index_below_the_floor(database_url: str) -> None:
    def candidates_scan(conn: psycopg.Connection[Any], name: str, after: int) -> tuple[str, int]:
        """The index the claim's scan for candidates used, and the buffers it touched (not the UPDATE's)."""
        query, params = claim_statement(name, after, [0])
        with conn.transaction(force_rollback=True):
            plan = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + query, params).fetchone()
        assert plan is not None
        [cte] = [node for node in plan[0][0]["Plan"]["Plans"] if node.get("Subplan Name") == "CTE candidates"]
        node = cte
        while "Index Name" not in node:  # Limit -> LockRows -> the scan
            node = node["Plans"][0]
        return node["Index Name"], int(cte["Shared Hit Blocks"]) + int(cte["Shared Read Blocks"])

    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url, autocommit=True) as reader,
    ):
        conn.execute("INSERT INTO outbox (topic, payload) SELECT 'sent', '{}' FROM generate_series(1, 20000)")
        # A long reader (S4's): vacuum may not remove what is deleted while its snapshot stands.
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM outbox")
        row = conn.execute("SELECT max(id) + 1 FROM outbox").fetchone()
        assert row is not None
        floor = int(row[0])
        conn.execute("DELETE FROM outbox")
        conn.execute("VACUUM outbox")
        live = insert(conn, "live")
        assert [r[0] for r in run_claim(conn, "claim_hinted", floor, [0])] == [live]
        # 20,000 dead index entries below the floor: the plain form reads their pages, the hinted one does not.
        index, plain = candidates_scan(conn, "claim", floor)
        assert index == "outbox_claim_idx"
        assert plain > 40
        index, hinted = candidates_scan(conn, "claim_hinted", floor)
        assert index == "outbox_claim_idx"
        assert hinted < 20


def test_the_store_learns_priorities_from_its_claims(database_url: str) -> None:
    # Its hinted claims must come within an interval of a full scan: a longer
    # interval than the others', so that a busy machine does not turn one into a full scan.
    interval = INTERVAL * 4

    async def scenario() -> None:
        async with opened_store(database_url, full_scan_interval=interval) as store:
            committed(database_url, "first")
            await send_all(store, await store.claim(10, max_attempts=5))  # a full scan
            await asyncio.sleep(interval * 1.2)
            # A full scan again (an interval passed); the first claim, an interval old, is the floor now.
            assert (await store.claim(10, max_attempts=5)).events == []
            urgent = committed(database_url, "urgent", priority=7)
            assert (await store.claim(10, max_attempts=5)).events == []  # hinted, and 7 is not known yet
            batch = await next_full_scan(store, interval)
            assert [e.id for e in batch.events] == [urgent]
            await send_all(store, batch)
            plain = committed(database_url, "plain")
            again = committed(database_url, "urgent", priority=7)
            # Within the interval: a hinted claim, which now enters the index at priority 7 too.
            assert [e.id for e in (await store.claim(10, max_attempts=5)).events] == [again, plain]

    asyncio.run(scenario())
