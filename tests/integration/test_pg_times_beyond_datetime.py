"""Times plain SQL can write that no Python datetime holds: the relay claims such rows, the admin commands show them.

PostgreSQL takes ``'infinity'``, ``'-infinity'`` and years up to 294276 in a
``timestamptz``; a datetime stops at 9999. A claim that loaded such a
``created_at`` as it is failed, and every claim after it: one row stalled the relay.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import psycopg
import pytest

from relay.config import TableName
from relay.store.postgres import PostgresStore
from tests.acceptance.cli import cli
from tests.conformance.harness import run

BEYOND = ["infinity", "-infinity", "20000-01-01 00:00:00+00", "4713-01-01 00:00:00+00 BC", "9999-12-31 23:59:59+00"]
FIRST, LAST = datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)
EDGES = {"infinity": LAST, "20000-01-01 00:00:00+00": LAST, "-infinity": FIRST, "4713-01-01 00:00:00+00 BC": FIRST}


@pytest.mark.parametrize("created_at", BEYOND)
@pytest.mark.parametrize("zone", ["UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago"])  # UTC, +14 h, -11 h
def test_a_claim_takes_rows_whose_created_at_no_datetime_holds(
    database_url: str, created_at: str, zone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGTZ", zone)  # libpq sends it after the relay's own TimeZone: the session's zone
    with psycopg.connect(database_url) as conn:
        for key in ("k", None):
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, created_at) VALUES ('t', %s, '{}', %s)", (key, created_at)
            )
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')")
    store = PostgresStore(database_url, TableName.parse("outbox"), owner="test", lease_seconds=30, listen=False)
    run(store.open())
    try:
        events = run(store.claim(10, max_attempts=5)).events
    finally:
        run(store.close())
    assert len(events) == 3
    for event in events[:2]:
        assert event.created_at.tzinfo is not None
        if created_at in EDGES:  # clamped to the nearest time a datetime holds, whatever the zone
            assert event.created_at == EDGES[created_at]


@pytest.mark.parametrize("moment", BEYOND)
@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/Anchorage"])
def test_dead_and_inspect_show_times_no_datetime_holds(database_url: str, moment: str, zone: str) -> None:
    # Any time column, in any session zone the operator's PGTZ sets: the commands show the row.
    with psycopg.connect(database_url) as conn:
        (event_id,) = conn.execute(
            "INSERT INTO outbox (topic, payload, state, last_error, created_at, failed_at)"
            " VALUES ('t', '{}', 'failed', 'boom', %s, %s) RETURNING id",
            (moment, moment),
        ).fetchone() or (0,)
        # The relay may set any deliver_at; writers are bounded (migration 0005), rows from before it are not.
        conn.execute("UPDATE outbox SET deliver_at = %s", (moment,))
    dead = cli("dead", "--json", "--database-url", database_url, PGTZ=zone)
    assert dead.returncode == 0, dead.stderr
    (listed,) = json.loads(dead.stdout)
    shown = cli("inspect", str(event_id), "--json", "--database-url", database_url, PGTZ=zone)
    assert shown.returncode == 0, shown.stderr
    row = json.loads(shown.stdout)
    for value in (listed["created_at"], listed["failed_at"], row["created_at"], row["deliver_at"]):
        if moment in ("infinity", "-infinity"):
            assert value == moment
        elif zone != "UTC":  # shown in the zone the operator's PGTZ asks for, as a datetime or as text
            assert value and value[0].isdigit()
        elif moment.startswith("9999"):  # a datetime holds it in UTC, the relay's sessions' zone
            assert value.replace("T", " ") == "9999-12-31 23:59:59+00:00"
        else:  # PostgreSQL's own text for it
            assert value == moment


@pytest.mark.parametrize("created_at", BEYOND)
def test_status_and_the_gauges_age_rows_no_datetime_holds(database_url: str, created_at: str) -> None:
    """'infinity' minus a time is no interval: the age clamps such a created_at to now (0) or to year 1."""
    with psycopg.connect(database_url) as conn:
        conn.execute("INSERT INTO outbox (topic, key, payload, created_at) VALUES ('t', 'k', '{}', %s)", (created_at,))
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k2', '{}')")
    shown = cli("status", "--json", "--database-url", database_url)
    assert shown.returncode == 0, shown.stderr
    status = json.loads(shown.stdout)
    assert status["pending"] == 2
    age = status["oldest_pending_age_seconds"]
    assert age >= 0 and (age > 3e10 if created_at.startswith(("-", "4713")) else age < 60), (created_at, age)
    store = PostgresStore(database_url, TableName.parse("outbox"), owner="test", lease_seconds=30, listen=False)
    run(store.open())
    try:
        assert run(store.oldest_pending_age()) == pytest.approx(age, abs=5.0)
        assert run(store.gauges()).pending == 2
    finally:
        run(store.close())


def test_a_created_at_ahead_of_the_clock_does_not_hide_the_age_of_the_events_after_it(database_url: str) -> None:
    """A writer that takes local time for UTC: the first event by id lies ahead, the next waits an hour."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, created_at) VALUES"
            " ('t', 'a', '{}', now() + interval '2 hours'), ('t', 'b', '{}', now() - interval '1 hour')"
        )
    shown = cli("status", "--json", "--database-url", database_url)
    assert shown.returncode == 0, shown.stderr
    assert 3500 < json.loads(shown.stdout)["oldest_pending_age_seconds"] < 3700, shown.stdout
