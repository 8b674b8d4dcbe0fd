"""The profile's EXPLAIN ANALYZE of the shipped claim and settle, against a real outbox (rolled back)."""

from __future__ import annotations

import psycopg

import producers
from bench.gauges import explain as gauges_explain
from bench.profile import _explain


def test_the_profile_explains_the_shipped_claim_settle_and_l_db_and_leaves_the_table_as_it_was(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for i in range(30):
            with conn.transaction():
                producers.publish(conn, "bench-explain", {"i": i}, key=f"k{i % 4}" if i % 3 else None)
        before = conn.execute("SELECT id, claim_token, attempts FROM outbox ORDER BY id").fetchall()
        found = _explain(database_url)
        after = conn.execute("SELECT id, claim_token, attempts FROM outbox ORDER BY id").fetchall()
    assert set(found) == {
        "claim UPDATE (1,000 rows)",
        "settle DELETE (ack_delete, 1,000 ids)",
        "L_db DELETE ... RETURNING (1,000 rows)",
    }
    assert all(plan["execution_ms"] > 0 for plan in found.values())
    assert after == before


def test_the_gauges_scenario_explains_status_gauges_and_the_oldest_age(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        for i in range(5):
            producers.publish(conn, "bench-explain", {"i": i})
    found = gauges_explain(database_url)
    assert set(found) == {"status", "gauges", "oldest_pending_age"}
    assert all(plan["execution_ms"] >= 0 and plan["scans"] for plan in found.values())
