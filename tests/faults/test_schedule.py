"""FaultSchedule keeps writers writing through every fault, and says when a fault met no load.

Real writers on a real database: the outbox table locked by the test is a
fault the writers cannot write through.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from tests.faults.checker import Writers
from tests.faults.schedule import FaultSchedule
from tests.relay_support import wait_until

QUOTA = 6


def writers_for(database_url: str) -> Writers:
    """Two writers with a quota they finish in a moment."""
    return Writers(database_url, "schedule-check", count=2, events=QUOTA, keys_per_writer=2, pause=0.01)


def waiting_for_a_lock(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    return int(row[0]) if row else 0


def test_writers_go_on_past_their_quota_until_the_last_fault_and_the_margin_are_over(database_url: str) -> None:
    writers = writers_for(database_url)
    with FaultSchedule(writers, margin=0.5) as schedule:
        for n in (1, 2):
            with schedule.fault(f"fault {n}"):
                time.sleep(0.5)
        during = writers.committed()
    after = writers.committed()
    time.sleep(0.3)
    assert during > QUOTA, "the writers stopped at their quota while the faults went on"
    assert after > during, "the writers stopped before the margin was over"
    assert writers.committed() == after, "the writers went on after the schedule was over"
    assert [f.name for f in schedule.faults] == ["fault 1", "fault 2"]
    assert all(f.commits > 0 for f in schedule.faults), schedule.faults
    assert not schedule.unloaded()


def test_a_fault_the_writers_could_not_write_through_is_reported(database_url: str) -> None:
    writers = writers_for(database_url)
    with (
        psycopg.connect(database_url, autocommit=True) as probe,
        psycopg.connect(database_url) as locker,
        FaultSchedule(writers, margin=0) as schedule,
    ):
        with schedule.fault("writing"):
            time.sleep(0.3)
        schedule.wait_for_commits(1)
        locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        try:
            wait_until(lambda: waiting_for_a_lock(probe) == 2, timeout=10)
            with schedule.fault("table locked"):
                time.sleep(0.5)
        finally:
            locker.rollback()
        with schedule.fault("writing again"):
            time.sleep(0.3)
    assert schedule.unloaded() == ["table locked"], schedule.faults
    assert "fewest commits during one: 0 (table locked)" in schedule.note()


def test_no_fault_starts_while_the_writers_commit_nothing(database_url: str) -> None:
    writers = writers_for(database_url)
    with psycopg.connect(database_url) as locker:
        locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        with (
            pytest.raises(AssertionError, match="no fault starts without load"),
            FaultSchedule(writers, patience=1.0) as schedule,
        ):
            try:
                schedule.begin()
            finally:
                locker.rollback()
    assert schedule.faults == []
