"""Retention: kept events are purged in batches once old enough; unsent ones never are."""

from __future__ import annotations

import asyncio

import psycopg

from relay.retention import purge_forever
from relay.store.postgres import PURGE_BATCH_SIZE
from tests.relay_support import opened_store

OLD = "now() - interval '2 hours'"


def seed(database_url: str, *, old_sent: int) -> None:
    """``old_sent`` sent events two hours old, and others the purge must keep."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            f"INSERT INTO outbox (topic, payload, state, published_at, created_at, idempotency_key)"
            f" SELECT 't', '{{}}', 'sent', {OLD}, {OLD}, 'bulk-' || g FROM generate_series(1, %s) AS g",
            [old_sent],
        )
        conn.execute(
            f"""INSERT INTO outbox (topic, payload, state, published_at, failed_at, created_at, idempotency_key)
                VALUES ('t', '{{}}', 'sent', now(), NULL, {OLD}, 'recent-sent'),
                       ('t', '{{}}', 'skipped', NULL, {OLD}, {OLD}, 'old-skipped'),
                       ('t', '{{}}', 'pending', NULL, NULL, {OLD}, 'old-pending'),
                       ('t', '{{}}', 'failed', NULL, {OLD}, {OLD}, 'old-failed')"""
        )


def left(database_url: str) -> list[str]:
    """The idempotency keys still in the outbox, sorted."""
    with psycopg.connect(database_url) as conn:
        return [r[0] for r in conn.execute("SELECT idempotency_key FROM outbox ORDER BY 1").fetchall()]


def test_purge_deletes_old_kept_events_in_batches_and_never_unsent_ones(database_url: str) -> None:
    old_sent = 2 * PURGE_BATCH_SIZE + 500  # three batches, the last one short

    async def purge() -> int:
        async with opened_store(database_url) as store:
            return await store.purge(3600)

    seed(database_url, old_sent=old_sent)
    assert asyncio.run(purge()) == old_sent + 1  # and the old skipped one
    assert left(database_url) == ["old-failed", "old-pending", "recent-sent"]


def test_the_retention_task_purges_at_once_and_stops_at_once(database_url: str) -> None:
    seed(database_url, old_sent=10)

    async def scenario() -> None:
        stop = asyncio.Event()
        async with opened_store(database_url) as store:
            task = asyncio.create_task(purge_forever(store, 3600, stop))
            for _ in range(100):  # the first purge runs at once
                await asyncio.sleep(0.05)
                if len(left(database_url)) == 3:
                    break
            stop.set()
            await asyncio.wait_for(task, 5)  # it stops at once, not after its minute

    asyncio.run(scenario())
    assert left(database_url) == ["old-failed", "old-pending", "recent-sent"]
