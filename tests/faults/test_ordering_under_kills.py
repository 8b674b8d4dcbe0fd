"""Per-key order and nothing lost with several relays, live writers and SIGKILLs.

The quick version runs in ``make test``; ``make faults`` (RELAY_FAULTS_FULL=1)
runs the full counts: 3 relays, 8 writers, 200 keys, 20,000 events.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from tests.faults.checker import KafkaCollector, Writers
from tests.faults.conftest import CRASH_ATTEMPTS, Recorder
from tests.faults.schedule import FaultSchedule
from tests.integration.kafka_support import unique_topic
from tests.relay_support import outbox_counts, relay_process, stop_process, wait_until

FULL = os.environ.get("RELAY_FAULTS_FULL") == "1"
EVENTS = 20_000 if FULL else 4_000
KILLS = 50 if FULL else 4
RELAYS = 3
BATCH = 200
LEASE = "9"


def start_relay(database_url: str, bootstrap: str) -> subprocess.Popen[str]:
    return relay_process(
        database_url, f"kafka://{bootstrap}", "--lease-seconds", LEASE, "--publish-timeout", "2", "--batch-size",
        str(BATCH), "--max-attempts", str(CRASH_ATTEMPTS),
    )  # fmt: skip


@pytest.mark.timeout(900 if FULL else 300)
def test_three_relays_with_random_sigkills_keep_every_key_in_order(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic = unique_topic("order")
    rng = random.Random(11)
    relays = [start_relay(database_url, kafka_bootstrap) for _ in range(RELAYS)]
    writers = Writers(database_url, topic, count=8, events=EVENTS, keys_per_writer=25, pause=0.002)
    kills = 0
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        try:
            # Every kill lands while the writers write: they go on until the last one is over.
            with FaultSchedule(writers) as schedule:
                while kills < KILLS:
                    time.sleep(rng.uniform(0.3, 1.5))
                    victim = rng.randrange(RELAYS)
                    with schedule.fault(f"kill {kills + 1}"):
                        stop_process(relays[victim], signal.SIGKILL)
                        kills += 1
                        relays[victim] = start_relay(database_url, kafka_bootstrap)
            wait_until(lambda: sum(outbox_counts(database_url).values()) == 0, timeout=120)
            committed = len(writers.ledger.committed)
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= committed, timeout=60)
            time.sleep(1.0)
        finally:
            codes = [stop_process(r) for r in relays]
        result = collector.verdict(writers.ledger)
    print(f"ordering under {kills} kills: {result}; {schedule.note()}")
    record(f"1/ordering: SIGKILL x{kills}, {RELAYS} relays, 8 writers, 200 keys", result, runs=kills,
           note=schedule.note())  # fmt: skip
    assert codes == [0] * RELAYS
    assert result.committed > EVENTS * 0.6
    assert result.rolled_back > 0
    assert result.ok, str(result)
    assert result.duplicates <= BATCH * 2 * kills
