"""A claim started and left unbuilt on real PostgreSQL while the next one runs on the same connection."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from relay.store.base import chained_keys
from tests.relay_support import opened_store


def seed(database_url: str, rows: list[tuple[str, str | None, int]]) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO outbox (topic, key, payload, priority) VALUES (%s, %s, %s, %s)",
            [(topic, key, f'{{"n": {n}}}', n % 3) for n, (topic, key, _) in enumerate(rows)],
        )


def test_a_started_claim_reads_as_its_events_and_the_next_claim_goes_on_from_its_tails(database_url: str) -> None:
    # Keys with one event, with several, on two topics, null keys, and three priorities.
    rows: list[tuple[str, str | None, int]] = [
        (f"t{n % 2}" if n % 7 else "t0", None if n % 5 == 0 else f"k{n % 6}", n) for n in range(60)
    ]
    seed(database_url, rows)

    async def scenario() -> None:
        async with opened_store(database_url) as store:
            first = await store.start_claim(20, max_attempts=5)
            # The next claim runs on the claim connection before the first's events are built.
            second = await store.start_claim(20, max_attempts=5, chain=[first.tails()])
            built = await first.events()
            later = await second.events()
            assert first.rows == len(built.events) == 20 and second.rows == len(later.events)
            assert built.token == first.token and later.token == second.token
            # The tails stand for the built claim in a chain.
            expected = {key: (e.id, e.topic) for key, e in chained_keys([built]).items()}
            assert {key: (e.id, e.topic) for key, e in chained_keys([first.tails()]).items()} == expected
            assert expected  # some key had two events or more in the first claim
            # The second went on after the first's keys: no event twice, each key in id order across both.
            ids = [e.id for e in built.events] + [e.id for e in later.events]
            assert len(ids) == len(set(ids))
            by_key: dict[str, list[int]] = {}
            for event in [*built.events, *later.events]:
                if event.key is not None:
                    by_key.setdefault(event.key, []).append(event.id)
            assert all(found == sorted(found) for found in by_key.values()), by_key
            assert any(e.chained for e in later.events)
            # Every event as the table has it: payload, topic, key.
            with psycopg.connect(database_url) as conn:
                table: dict[int, Any] = {
                    r[0]: r[1:] for r in conn.execute("SELECT id, topic, key, payload::text FROM outbox")
                }
            for event in [*built.events, *later.events]:
                assert (event.topic, event.key, event.payload.decode()) == table[event.id]

    asyncio.run(scenario())
