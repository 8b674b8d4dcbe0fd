"""Fault scenarios on MySQL (MariaDB here): SIGKILLed relays keep every key in order and lose nothing,
and bad input is dead-lettered while the rest flows.

Writers use ``publish()`` and plain SQL, 30% rolled back. The relays' own link
to the database also goes through a fault proxy: latency, resets, a black
hole, slow closes (5c on MySQL). The quick version
runs in ``make test``; ``make faults`` (RELAY_FAULTS_FULL=1) runs the full counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests import mysql_support
from tests.faults.checker import KafkaCollector
from tests.faults.conftest import CRASH_ATTEMPTS, FULL, Recorder
from tests.faults.mysql_writers import MySQLWriters
from tests.faults.proxy import FaultProxy
from tests.faults.schedule import FaultSchedule, LinkFault, link_fault_rounds
from tests.integration.kafka_support import consume, unique_topic
from tests.relay_support import relay_process, stop_process, wait_until

EVENTS = 20_000 if FULL else 2_000
KILLS = 30 if FULL else 3
RELAYS = 2
BATCH = 200


def start_relay(url: str, bootstrap: str, *extra: str) -> subprocess.Popen[str]:
    return relay_process(
        url,
        f"kafka://{bootstrap}",
        "--lease-seconds",
        "9",
        "--publish-timeout",
        "2",
        "--batch-size",
        str(BATCH),
        "--max-attempts",
        str(CRASH_ATTEMPTS),
        *extra,
    )


def left(url: str) -> list[tuple[object, ...]]:
    return mysql_support.execute(
        url,
        "SELECT id, `key`, state, attempts, lease_expires_at, UTC_TIMESTAMP(6), deliver_at, last_error"
        " FROM outbox ORDER BY id LIMIT 10",
    )


def remaining(url: str) -> int:
    return sum(mysql_support.outbox_counts(url).values())


@pytest.mark.timeout(900 if FULL else 300)
def test_two_relays_with_random_sigkills_keep_every_key_in_order_on_mysql(
    mysql_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic = unique_topic("mysql-order")
    rng = random.Random(17)
    relays = [start_relay(mysql_url, kafka_bootstrap) for _ in range(RELAYS)]
    writers = MySQLWriters(mysql_url, topic, count=4, events=EVENTS, keys_per_writer=25, pause=0.005)
    kills = 0
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        try:
            with FaultSchedule(writers) as schedule:
                while kills < KILLS:
                    time.sleep(rng.uniform(0.5, 1.5))
                    victim = rng.randrange(RELAYS)
                    with schedule.fault(f"kill {kills + 1}"):
                        stop_process(relays[victim], signal.SIGKILL)
                        kills += 1
                        relays[victim] = start_relay(mysql_url, kafka_bootstrap)
            try:
                wait_until(lambda: remaining(mysql_url) == 0, timeout=120)
            except AssertionError:
                # Say why: what is left, and whether the relays still run (and what they said).
                alive = [r.poll() is None for r in relays]
                for r in relays:
                    r.send_signal(signal.SIGTERM)
                said = [(r.communicate(timeout=30)[1] or "")[-800:] for r in relays]
                counts = mysql_support.outbox_counts(mysql_url)
                raise AssertionError(f"not drained: {counts}; first rows {left(mysql_url)}; {alive=}; {said}") from None
            committed = len(writers.ledger.committed)
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= committed, timeout=60)
            time.sleep(1.0)
        finally:
            codes = [stop_process(r) for r in relays]
        result = collector.verdict(writers.ledger)
    print(f"mysql ordering under {kills} kills: {result}; {schedule.note()}")
    record(f"1/ordering on MySQL: SIGKILL x{kills}, {RELAYS} relays, 4 writers (publish and SQL), 100 keys", result,
           runs=kills, note=schedule.note())  # fmt: skip
    assert codes == [0] * RELAYS
    assert result.committed > EVENTS * 0.6
    assert result.rolled_back > 0
    assert result.ok, str(result)
    assert result.duplicates <= BATCH * 2 * kills


@pytest.mark.timeout(120)
def test_a_payload_over_the_kafka_limit_is_dead_lettered_at_once_and_parks_only_its_key(
    mysql_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic("mysql-big")
    big = json.dumps({"pad": "x" * (2 * 1024 * 1024)})  # over the relay's 1 MiB default message limit
    rows = [(topic, "big", big, "huge"), (topic, "big", "{}", "behind-huge")]
    rows += [(topic, f"k{n % 5}", json.dumps({"n": n}), f"e{n}") for n in range(50)]
    mysql_support.insert_many(mysql_url, mysql_support.INSERT_EVENT, rows)
    relay = start_relay(mysql_url, kafka_bootstrap)
    try:
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {"failed": 1, "pending": 1}, timeout=60)
    finally:
        assert stop_process(relay) == 0
    received = consume(kafka_bootstrap, topic, count=50, settle_seconds=1.0)
    assert sorted(m.headers["idempotency-key"] for m in received) == sorted(f"e{n}".encode() for n in range(50))
    [(attempts, error)] = mysql_support.execute(
        mysql_url, "SELECT attempts, last_error FROM outbox WHERE idempotency_key = 'huge'"
    )
    assert attempts == 1 and error


def via_proxy(url: str, proxy: FaultProxy) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=auth + proxy.address))


@contextlib.contextmanager
def relays_via(url: str, bootstrap: str, count: int, logs: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """``count`` relays on ``url``, their output in files: an outage makes them log more than a pipe holds."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    args = [sys.executable, "-m", "relay", "run", "--database-url", url, "--sink", f"kafka://{bootstrap}",
            "--batch-size", str(BATCH), "--max-attempts", "10", "--lease-seconds", "9", "--publish-timeout", "2",
            "--poll-interval", "0.05", "--poll-interval-max", "0.2", "--log-level", "WARNING",
            # The link's faults start at once: on a busy machine a reset may reach a relay still starting,
            # where an unreachable database is otherwise reported and ends it.
            "--startup-timeout", "60"]  # fmt: skip
    relays = []
    try:
        for n in range(count):
            with (logs / f"relay-{n}.log").open("w") as out:
                relays.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, text=True,
                                               env=base))  # fmt: skip
        yield relays
    finally:
        for relay in relays:
            if relay.poll() is None:  # the test failed before it stopped them
                stop_process(relay, signal.SIGKILL)


#: The faults of the relays' database link, each round.
LINK_FAULTS = (
    LinkFault("latency 50 ms", lambda proxy: proxy.latency(0.05), 2.0),
    LinkFault("latency 200 ms", lambda proxy: proxy.latency(0.2), 2.0),
    LinkFault("reset", FaultProxy.reset, 1.0),
    LinkFault("black hole", FaultProxy.blackhole, 6.0),
    LinkFault("slow close", lambda proxy: proxy.slow_close(1.5), 4.5),
)


@pytest.mark.timeout(900 if FULL else 300)
def test_relays_ride_out_latency_resets_black_holes_and_slow_closes_on_the_mysql_link(
    mysql_url: str, kafka_bootstrap: str, record: Recorder, tmp_path: Path
) -> None:
    rounds = 3 if FULL else 1
    topic = unique_topic("mysql-link")
    target = urlsplit(mysql_url)
    events = 3_000 * rounds
    with (
        FaultProxy(target.hostname or "127.0.0.1", target.port or 3306) as proxy,
        KafkaCollector(kafka_bootstrap, topic) as collector,
        relays_via(via_proxy(mysql_url, proxy), kafka_bootstrap, RELAYS, tmp_path) as relays,
    ):
        # The writers reach the database directly: only the relays' link is faulty.
        writers = MySQLWriters(mysql_url, topic, count=4, events=events, keys_per_writer=25, pause=0.02)
        with FaultSchedule(writers) as schedule:
            link_fault_rounds(schedule, proxy, LINK_FAULTS, rounds)
        try:
            wait_until(lambda: remaining(mysql_url) == 0, timeout=120)
        except AssertionError:
            said = [(tmp_path / f"relay-{n}.log").read_text()[-800:] for n in range(RELAYS)]
            alive = [r.poll() is None for r in relays]
            raise AssertionError(f"not drained: {mysql_support.outbox_counts(mysql_url)}; {alive=}; {said}") from None
        committed = len(writers.ledger.committed)
        collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= committed, timeout=60)
        time.sleep(1.0)
        alive = [r.poll() is None for r in relays]
        codes = [stop_process(r) for r in relays]
        result = collector.verdict(writers.ledger)
    note = f"latency 50/200 ms, reset, black hole 6 s, slow close x{rounds}; {proxy.accepted} connections; "
    note += schedule.note()
    print(f"5c on MySQL: {result}; {note}")
    record(f"5c/database on MySQL: the relays' link faulty x{rounds}, {RELAYS} relays, 100 keys", result,
           runs=rounds, note=note)  # fmt: skip
    assert not schedule.unloaded(), note
    assert alive == [True] * RELAYS and codes == [0] * RELAYS, (alive, codes)
    assert proxy.accepted > RELAYS, "the relays never had to reconnect: the faults did not reach them"
    assert result.committed > events * 0.6
    assert result.ok, str(result)
