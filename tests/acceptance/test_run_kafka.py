"""``outbox-relay run`` as a subprocess against real PostgreSQL and the Tansu broker."""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
from collections import Counter

import psycopg
import pytest

from devservers import free_port, wait_for_port
from tests.integration.kafka_support import consume, unique_topic
from tests.relay_support import outbox_counts, relay_process, status_json, stop_process, wait_until

EVENTS = 20_000


def fill(database_url: str, topic: str, n: int = EVENTS) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, idempotency_key)"
            " SELECT %s, 'k' || (g %% 300), jsonb_build_object('n', g), 'e' || g FROM generate_series(1, %s) g",
            [topic, n],
        )


def remaining(database_url: str) -> int:
    return sum(outbox_counts(database_url).values())


def in_flight(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE lease_expires_at > now()").fetchone()
    return int(row[0]) if row else 0


def delivered(bootstrap: str, topic: str, expected: int) -> Counter[bytes]:
    return Counter(m.headers["idempotency-key"] for m in consume(bootstrap, topic, count=expected, timeout=60))


@pytest.mark.timeout(240)
def test_sigterm_under_load_exits_0_and_loses_nothing(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    fill(database_url, topic)
    proc = relay_process(database_url, f"kafka://{kafka_bootstrap}")
    wait_until(lambda: remaining(database_url) < EVENTS - 500, timeout=60)
    assert stop_process(proc, signal.SIGTERM) == 0
    left = status_json(database_url)
    assert left["in_flight"] == 0, "a graceful stop settles or releases the batch in hand"
    assert left["pending"] > 0, "stopped under load: something should be left to prove the restart"
    again = relay_process(database_url, f"kafka://{kafka_bootstrap}")
    wait_until(lambda: remaining(database_url) == 0, timeout=120)
    assert stop_process(again) == 0
    seen = delivered(kafka_bootstrap, topic, EVENTS)
    assert set(seen) == {f"e{i}".encode() for i in range(1, EVENTS + 1)}
    assert sum(seen.values()) == EVENTS, "a graceful stop makes no duplicates"


@pytest.mark.timeout(240)
def test_sigkill_under_load_then_restart_loses_nothing(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    fill(database_url, topic)
    proc = relay_process(database_url, f"kafka://{kafka_bootstrap}")
    wait_until(lambda: remaining(database_url) < EVENTS - 500, timeout=60)
    # Kill it with leases in hand, so the restart has to wait them out.
    wait_until(lambda: in_flight(database_url) > 0, timeout=30, interval=0.01)
    assert stop_process(proc, signal.SIGKILL) == -signal.SIGKILL
    again = relay_process(database_url, f"kafka://{kafka_bootstrap}")
    wait_until(lambda: remaining(database_url) == 0, timeout=120)
    assert stop_process(again) == 0
    seen = delivered(kafka_bootstrap, topic, EVENTS)
    assert set(seen) == {f"e{i}".encode() for i in range(1, EVENTS + 1)}, "nothing lost"
    duplicates = sum(seen.values()) - EVENTS
    assert duplicates <= 200 * 2, f"at most the batches in hand are sent twice, got {duplicates}"


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.timeout(120)
def test_metrics_health_and_readiness(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    fill(database_url, topic, 500)
    port = free_port()
    proc = relay_process(database_url, f"kafka://{kafka_bootstrap}", "--metrics-port", str(port))
    try:
        wait_for_port("127.0.0.1", port)
        wait_until(lambda: remaining(database_url) == 0, timeout=60)
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        status, text = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert metric(text, f'outbox_relay_published_total{{topic="{topic}"}}') == 500
        for name in (
            "outbox_relay_failed_attempts_total",
            "outbox_relay_dead_lettered_total",
            "outbox_relay_pending",
            "outbox_relay_oldest_pending_age_seconds",
            "outbox_relay_publish_latency_seconds_bucket",
        ):
            assert name in text, name
        assert metric(text, "outbox_relay_publish_latency_seconds_count") == 500
        time.sleep(0.1)
        assert http_get(f"http://127.0.0.1:{port}/nope")[0] == 404
    finally:
        assert stop_process(proc) == 0


@pytest.mark.timeout(120)
def test_cloudevents_from_the_command_line_with_the_source_from_the_environment(
    database_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic()
    fill(database_url, topic, n=3)
    proc = relay_process(
        database_url, f"kafka://{kafka_bootstrap}?format=cloudevents", env={"RELAY_EVENT_SOURCE": "urn:shop:orders"}
    )
    try:
        wait_until(lambda: remaining(database_url) == 0, timeout=60)
    finally:
        assert stop_process(proc) == 0
    received = consume(kafka_bootstrap, topic, count=3)
    assert sorted(m.headers["ce_id"] for m in received) == [b"e1", b"e2", b"e3"]
    for message in received:
        assert message.headers["ce_source"] == b"urn:shop:orders"
        assert message.headers["ce_type"] == topic.encode()
        assert message.headers["ce_partitionkey"] == message.key
        assert message.headers["content-type"] == b"application/json"
