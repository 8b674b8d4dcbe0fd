"""``run`` refuses Kafka options that weaken the guarantees before it starts, and relays with the others."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

import producers
from devservers import free_port
from tests.acceptance.cli import cli
from tests.integration.kafka_support import consume, unique_topic
from tests.relay_support import relay_process, stop_process, wait_until
from tests.unit.test_kafka_options import REFUSED


def refused(option: str, database_url: str) -> subprocess.CompletedProcess[str]:
    return cli("run", "--database-url", database_url, "--sink", f"kafka://127.0.0.1:9092?{option}")


@pytest.mark.timeout(300)
def test_each_refused_option_is_a_one_line_error_before_anything_runs() -> None:
    # Nothing listens there: an error about the database would mean the option was not checked first.
    nowhere = f"postgresql://app@127.0.0.1:{free_port()}/db"
    options = [option for option, _ in REFUSED]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda option: refused(option, nowhere), options))
    for (option, named), result in zip(REFUSED, results, strict=True):
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, (option, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("outbox-relay: error: "), (option, result.stderr)
        assert named in lines[0], (option, lines[0])


@pytest.mark.timeout(120)
def test_a_relay_with_options_that_keep_the_guarantees_delivers(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic("options")
    with psycopg.connect(database_url) as conn:
        for n in range(10):
            producers.publish(conn, topic, {"n": n}, key=f"k{n % 3}", idempotency_key=f"e{n}")
    options = "linger.ms=20&compression.type=lz4&client.id=billing&batch.size=65536&log_level=6&acks=all"
    proc = relay_process(database_url, f"kafka://{kafka_bootstrap}?{options}&socket_keepalive_enable=true")
    try:
        wait_until(lambda: proc.poll() is not None or _left(database_url) == 0, timeout=60)
    finally:
        code = stop_process(proc, signal.SIGTERM)
    assert code == 0
    received = consume(kafka_bootstrap, topic, count=10, timeout=30)
    assert sorted(m.headers["idempotency-key"] for m in received) == sorted(f"e{n}".encode() for n in range(10))


def _left(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return int(row[0]) if row else 0
