"""The log source bench's rounds of drains (bench/log_source.py): one round of a spread drains the same
seeded rows through the log relay and the table source, and leaves neither database nor slot behind."""

from __future__ import annotations

import psycopg
import pytest

from bench import log_source

pytestmark = pytest.mark.timeout(180)
EVENTS = 2_000


@pytest.mark.parametrize("log_first", [True, False], ids=["log first", "table first"])
def test_a_round_drains_both_sources_and_drops_their_databases_and_slots(logical_server: str, log_first: bool) -> None:
    name = f"round_{int(log_first)}"

    pair = log_source._drain_pair(logical_server, name, EVENTS, 1000, None, log_first=log_first)

    assert set(pair) == {"log", "table"}
    assert all(pair[source]["rate"] > 0 and pair[source]["cpu_per_1000"] > 0 for source in pair)
    with psycopg.connect(logical_server, autocommit=True) as conn:
        databases = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [f"%{name}"]).fetchall()
        slots = conn.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE %s", [f"%{name}"])
        assert (databases, slots.fetchall()) == ([], [])
