"""The log source under faults: relays on one slot SIGKILLed at random while writers write rows and
logical messages (a third of the transactions rolled back). Nothing lost, no rolled-back event, each key
in order; the table holds nothing once every event arrived.

The quick version runs in ``make test``; ``make faults`` (RELAY_FAULTS_FULL=1) runs the full counts.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from typing import Any

import psycopg
import pytest

import producers
from tests.faults.checker import KafkaCollector, Writers
from tests.faults.conftest import CRASH_ATTEMPTS, Recorder
from tests.faults.schedule import FaultSchedule
from tests.integration.kafka_support import unique_topic
from tests.integration.test_log_source import big_transaction
from tests.relay_support import outbox_counts, relay_process, stop_process, wait_until

FULL = os.environ.get("RELAY_FAULTS_FULL") == "1"
EVENTS = 10_000 if FULL else 1_500
KILLS = 20 if FULL else 3
RELAYS = 2


class MixedWriters(Writers):
    """Writers whose even transactions write rows and odd ones logical messages."""

    def _publish(self, conn: psycopg.Connection[Any], batch: list[tuple[str, str, int]], rollback: bool) -> None:
        via = "message" if batch and batch[0][2] % 2 else "table"
        with conn.transaction(force_rollback=rollback):
            for idem, key, seq in batch:
                producers.publish(conn, self.topic, {"key": key, "seq": seq}, key=key, idempotency_key=idem, via=via)


def start_relay(url: str, slot: str, bootstrap: str) -> subprocess.Popen[str]:
    return relay_process(
        url, f"kafka://{bootstrap}", "--source", "log", "--slot", slot, "--publish-timeout", "2",
        "--max-attempts", str(CRASH_ATTEMPTS),
    )  # fmt: skip


@pytest.mark.timeout(900 if FULL else 300)
def test_log_relays_with_random_sigkills_lose_nothing_and_keep_key_order(
    log_database: tuple[str, str], kafka_bootstrap: str, record: Recorder
) -> None:
    url, slot = log_database
    topic = unique_topic("log")
    rng = random.Random(38)
    relays = [start_relay(url, slot, kafka_bootstrap) for _ in range(RELAYS)]
    writers = MixedWriters(url, topic, count=4, events=EVENTS, keys_per_writer=25, pause=0.002)
    kills = 0
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        try:
            with FaultSchedule(writers) as schedule:
                while kills < KILLS:
                    time.sleep(rng.uniform(0.5, 2.0))
                    # Mostly the reader (the oldest relay alive leads, usually), now and then a standby.
                    victim = rng.randrange(RELAYS)
                    with schedule.fault(f"kill {kills + 1}"):
                        stop_process(relays[victim], signal.SIGKILL)
                        kills += 1
                        relays[victim] = start_relay(url, slot, kafka_bootstrap)
            committed = len(writers.ledger.committed)
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= committed, timeout=120)
            wait_until(lambda: sum(outbox_counts(url).values()) == 0, timeout=60)
            time.sleep(1.0)
        finally:
            codes = [stop_process(r) for r in relays]
        result = collector.verdict(writers.ledger)
    print(f"log source under {kills} kills: {result}; {schedule.note()}")
    record(f"log source: SIGKILL x{kills}, {RELAYS} relays on one slot, rows and messages", result, runs=kills,
           note=schedule.note())  # fmt: skip
    assert codes == [0] * RELAYS
    assert result.rolled_back > 0
    assert result.ok, str(result)


def _slot_reader(url: str, slot: str) -> int | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", [slot]).fetchone()
    return row[0] if row else None


@pytest.mark.timeout(300)
def test_a_frozen_reader_loses_the_slot_to_a_standby_and_wakes_to_confirm_nothing(
    log_database: tuple[str, str], kafka_bootstrap: str, record: Recorder
) -> None:
    url, slot = log_database
    topic = unique_topic("logfreeze")
    leader = start_relay(url, slot, kafka_bootstrap)
    standby: subprocess.Popen[str] | None = None
    writers = MixedWriters(url, topic, count=2, events=600, keys_per_writer=10, pause=0.01)
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        try:
            wait_until(lambda: _slot_reader(url, slot) is not None, timeout=30)
            first_reader = _slot_reader(url, slot)
            standby = start_relay(url, slot, kafka_bootstrap)
            writers.start()
            time.sleep(1.0)
            leader.send_signal(signal.SIGSTOP)
            # Past the bound (10 s idle session and WAL sender timeouts), the standby reads the slot.
            wait_until(lambda: _slot_reader(url, slot) not in (None, first_reader), timeout=60)
            leader.send_signal(signal.SIGCONT)
            writers.join()
            committed = len(writers.ledger.committed)
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= committed, timeout=120)
            wait_until(lambda: sum(outbox_counts(url).values()) == 0, timeout=60)
            time.sleep(1.0)
        finally:
            leader.send_signal(signal.SIGCONT)
            codes = [stop_process(leader)] + ([stop_process(standby)] if standby is not None else [])
        result = collector.verdict(writers.ledger)
    print(f"log source, frozen reader: {result}")
    record("log source: SIGSTOP the reader past the bound, a standby takes over, SIGCONT", result)
    assert codes == [0, 0]
    assert result.ok, str(result)


@pytest.mark.skipif(not FULL, reason="100,000 events: make faults (RELAY_FAULTS_FULL=1)")
@pytest.mark.timeout(900)
def test_a_100000_event_transaction_in_a_bounded_window(log_database: tuple[str, str], record: Recorder) -> None:
    asyncio.run(big_transaction(*log_database, 100_000))
    record("log source: one 100,000-event transaction, bounded window, confirmed whole", None, events=100_000)
