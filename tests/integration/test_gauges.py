"""The relay's table gauges on real PostgreSQL: the same figures as ``status --json``, at a bounded cost."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
import pytest

import producers
from relay.config import TableName
from relay.loop import Relay
from relay.metrics import Metrics
from relay.sinks.memory import MemorySink
from relay.store import sql as named
from relay.store.base import Dead, Status
from relay.store.migrate import create_roles
from relay.store.postgres import PostgresStore
from tests.relay_support import FAST, status_json, wait_until
from tests.unit.test_loop import run_until

T = TypeVar("T")
TABLE = TableName.parse("outbox")


def on_store(url: str, work: Any) -> Any:
    """Run ``work(store)`` on an open store and close it."""

    async def go() -> Any:
        store = PostgresStore(url, TABLE, owner="test", lease_seconds=30, listen=False)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(go())


def gauge_values(metrics: Metrics) -> dict[str, float]:
    return {
        "pending": metrics.pending._value.get(),
        "in_flight": metrics.in_flight._value.get(),
        "failed": metrics.failed._value.get(),
        "parked_keys": metrics.parked_keys._value.get(),
        "oldest_pending_age_seconds": metrics.oldest_pending_age._value.get(),
    }


def a_bit_of_everything(url: str) -> None:
    """Due, scheduled, leased, expired and dead-lettered events, with and without keys, two priorities."""
    with psycopg.connect(url) as conn:
        for i in range(40):
            producers.publish(
                conn,
                "t",
                {"i": i},
                key=f"k{i % 5}" if i % 3 else None,
                priority=1 if i % 7 == 0 else 0,
                deliver_at=datetime.now(UTC) + timedelta(hours=1) if i % 11 == 0 else None,
            )

    async def work(store: PostgresStore) -> None:
        claim = await store.claim(8, max_attempts=5)
        await store.settle(claim, sent=[], retry=[], dead=[Dead(e.id, "x") for e in claim.events[:3]])
        await store.claim(4, max_attempts=5)

    on_store(url, work)
    with psycopg.connect(url) as conn:
        # One lease whose relay died: pending again, not in flight.
        conn.execute(
            "UPDATE outbox SET lease_expires_at = now() - interval '1 second'"
            " WHERE id = (SELECT min(id) FROM outbox WHERE lease_expires_at IS NOT NULL)"
        )


def test_the_gauges_match_status_json_on_a_small_table(database_url: str) -> None:
    a_bit_of_everything(database_url)
    metrics = Metrics()

    async def refresh(store: PostgresStore) -> None:
        metrics.observe_status(await store.gauges())

    on_store(database_url, refresh)
    shown = status_json(database_url)
    gauges = gauge_values(metrics)
    assert shown["failed"] == 3 and shown["in_flight"] > 0 and shown["parked_keys"] > 0
    for name in ("pending", "in_flight", "failed", "parked_keys"):
        assert gauges[name] == shown[name], name
    assert gauges["oldest_pending_age_seconds"] == pytest.approx(shown["oldest_pending_age_seconds"], abs=5.0)


def test_past_the_bound_the_total_is_estimated_and_follows_inserts_and_deletes(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state, failed_at)"
            " SELECT 't', 'k' || (g % 7), '{}', CASE WHEN g % 100 = 0 THEN 'failed' ELSE 'pending' END,"
            "        CASE WHEN g % 100 = 0 THEN now() END"
            " FROM generate_series(1, 3000) AS g"
        )
        conn.execute("ANALYZE outbox")
    bound = 100

    def both(store: PostgresStore) -> Coroutine[Any, Any, tuple[Status, Status]]:
        async def go() -> tuple[Status, Status]:
            return await store.status(), await store.gauges(exact_up_to=bound)

        return go()

    exact, cheap = on_store(database_url, both)
    assert (exact.pending, exact.failed) == (2970, 30)
    assert (cheap.pending, cheap.in_flight, cheap.failed, cheap.parked_keys) == (2970, 0, 30, exact.parked_keys)

    # Relays deliver 1,000 events and writers add 500, with no ANALYZE since:
    # the live-row counter follows at once (each session's counts are flushed
    # when it ends).
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "DELETE FROM outbox WHERE id IN"
            " (SELECT id FROM outbox WHERE state = 'pending' ORDER BY priority DESC, id LIMIT 1000)"
        )
        conn.execute("INSERT INTO outbox (topic, payload) SELECT 't', '{}' FROM generate_series(1, 500)")

    def pending_gauge() -> int:
        return int(on_store(database_url, lambda store: store.gauges(exact_up_to=bound)).pending)

    wait_until(lambda: abs(pending_gauge() - 2470) <= 2470 * 0.02, timeout=30, interval=0.5)
    assert on_store(database_url, lambda store: store.status()).pending == 2470


def test_past_the_bound_in_flight_counts_the_leases_at_the_front(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("INSERT INTO outbox (topic, payload) SELECT 't', '{}' FROM generate_series(1, 500)")
        conn.execute("ANALYZE outbox")
    cheap = on_store(
        database_url,
        lambda store: _claim_then(store, lambda: store.gauges(exact_up_to=100)),
    )
    assert (cheap.pending, cheap.in_flight) == (450, 50)


async def _claim_then(store: PostgresStore, then: Any) -> Any:
    await store.claim(50, max_attempts=5)
    return await then()


def test_the_gauges_query_reads_indexes_only(database_url: str) -> None:
    """Whatever the plan (custom, or the generic one psycopg's prepared statement may get), no table scan."""
    query = named.render(named.queries()["gauges"], TABLE)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state)"
            " SELECT 't', 'k' || (g % 500), '{}', CASE WHEN g % 1000 = 0 THEN 'failed' ELSE 'pending' END"
            " FROM generate_series(1, 50000) AS g"
        )
        conn.execute("VACUUM ANALYZE outbox")
        params = {"exact_up_to": 1000, "table_name": '"outbox"', "state_column": "state"}
        custom = "\n".join(r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ") + query, params))
        text = query.as_string(conn).replace("%(exact_up_to)s", "$1").replace("%(table_name)s", "$2")
        text = text.replace("%(state_column)s", "$3")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE gauges (bigint, text, text) AS {text}")
        generic = "\n".join(r[0] for r in conn.execute("EXPLAIN EXECUTE gauges (1000, '\"outbox\"', 'state')"))
    for plan in (custom, generic):
        assert "outbox_claim_idx" in plan, plan
        assert "outbox_failed_idx" in plan, plan
        assert "Seq Scan on outbox" not in plan, plan


def test_the_relay_role_reads_the_statistics_the_estimate_needs(pg_admin_url: str, database_url: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    role, user = f"relay_{suffix}", f"relay_user_{suffix}"
    create_roles(database_url, TABLE, relay_role=role, writer_role=f"writer_{suffix}")
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{user}" LOGIN IN ROLE "{role}"')
    try:
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "INSERT INTO outbox (topic, payload, state)"
                " SELECT 't', '{}', CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'pending' END"
                " FROM generate_series(1, 300) AS g"
            )
            conn.execute("ANALYZE outbox")
        info = psycopg.conninfo.conninfo_to_dict(database_url)
        as_relay = psycopg.conninfo.make_conninfo(**{**{k: str(v) for k, v in info.items()}, "user": user})
        # Without the share of unsent rows (pg_stats hides columns a role cannot
        # read) the estimate would count the 30 dead letters as pending too.
        cheap = on_store(as_relay, lambda store: store.gauges(exact_up_to=10))
        assert (cheap.pending, cheap.failed) == (270, 30)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            for name in (user, role, f"writer_{suffix}"):
                conn.execute(f'DROP OWNED BY "{name}"')
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            for name in (user, role, f"writer_{suffix}"):
                conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_a_running_relay_shows_what_waits_on_a_schedule_in_its_metrics(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        # Plain SQL may write what publish() refuses: a key parked until the year 9999, one event behind it.
        # (Written before the table bounded deliver_at, migration 0005: inserted, then moved.)
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')")
        conn.execute("UPDATE outbox SET deliver_at = '9999-12-31'")
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')")
        conn.execute("INSERT INTO outbox (topic, payload, deliver_at) VALUES ('t', '{}', now() + interval '1 day')")
    sink = MemorySink()
    relay = Relay(PostgresStore(database_url, TABLE, owner="test", lease_seconds=30, listen=False), sink, FAST)

    def shown(name: str) -> float | None:
        values = [
            line.split(" ")[1] for line in relay.metrics.render().decode().splitlines() if line.split(" ")[0] == name
        ]
        return float(values[0]) if values else None

    # The relay reads the counts as it starts; one reading sets them all.
    asyncio.run(run_until(relay, lambda: shown("outbox_relay_pending") == 3, timeout=10))
    assert sink.attempted == [], "nothing was due"
    assert (shown("outbox_relay_scheduled"), shown("outbox_relay_keys_waiting_on_schedule")) == (2, 1)
