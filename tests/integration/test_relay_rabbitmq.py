"""The relay end to end: PostgreSQL to RabbitMQ, in the contract's shape."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import pytest

import producers
from tests.acceptance.cli import cli
from tests.integration.rabbit_support import temp_exchange, temp_queue, unique_name
from tests.relay_support import RelayThread, outbox_counts, wait_until


def test_events_arrive_persistent_with_message_id_and_headers(database_url: str, amqp_url: str) -> None:
    with temp_exchange(amqp_url) as exchange, temp_queue(amqp_url, exchange=exchange, routing_keys=["orders"]) as q:
        with psycopg.connect(database_url) as conn:
            producers.publish(conn, "orders", {"n": 1}, key="o-1", headers={"trace": "t1"}, idempotency_key="a")
            producers.publish(conn, "orders", {"n": 2}, key="o-1", idempotency_key="b")
            with conn.transaction(force_rollback=True):
                producers.publish(conn, "orders", {"n": 3}, idempotency_key="rolled-back")
        with RelayThread(database_url, f"{amqp_url}?exchange={exchange}"):
            wait_until(lambda: not outbox_counts(database_url))
            messages = q.collect(2)
    assert [m.message_id for m in messages] == ["a", "b"]
    first = messages[0]
    assert first.exchange == exchange and first.routing_key == "orders"
    assert json.loads(first.body) == {"n": 1}
    assert first.content_type == "application/json" and first.delivery_mode == 2
    assert first.headers == {"trace": "t1", "idempotency-key": "a"}


def test_unroutable_event_is_retried_then_dead_lettered_while_others_flow(database_url: str, amqp_url: str) -> None:
    nowhere = unique_name("nowhere")
    with temp_queue(amqp_url) as q:
        with psycopg.connect(database_url) as conn:
            producers.publish(conn, nowhere, {"lost": "never"}, key="k", idempotency_key="unroutable")
            producers.publish(conn, nowhere, {"after": 1}, key="k", idempotency_key="waits-behind")
            for i in range(20):
                producers.publish(conn, q.name, {"i": i}, idempotency_key=f"ok-{i}")
        with RelayThread(database_url, amqp_url, max_attempts=3) as relay:
            wait_until(lambda: outbox_counts(database_url) == {"failed": 1, "pending": 1}, timeout=30)
            assert sorted(m.message_id or "" for m in q.collect(20)) == sorted(f"ok-{i}" for i in range(20))
            assert relay.relay is not None
            assert relay.relay.metrics.dead_lettered._value.get() == 1
            assert relay.relay.metrics.failed_attempts._value.get() == 3

            dead = json.loads(cli("dead", "--json", "--database-url", database_url).stdout)
            assert [(d["idempotency_key"], d["attempts"], d["blocks_key"]) for d in dead] == [("unroutable", 3, "k")]
            assert "unroutable" in dead[0]["last_error"] or "NO_ROUTE" in dead[0]["last_error"]
            status = json.loads(cli("status", "--json", "--database-url", database_url).stdout)
            assert (status["failed"], status["parked_keys"]) == (1, 1)

            # The cause is fixed (a queue is bound), the operator requeues: the key flows in order.
            with temp_queue(amqp_url, name=nowhere) as fixed:
                result = cli("requeue", "--key", "k", "--database-url", database_url)
                assert result.returncode == 0 and "requeued 1" in result.stdout
                wait_until(lambda: not outbox_counts(database_url), timeout=30)
                assert [m.message_id for m in fixed.collect(2)] == ["unroutable", "waits-behind"]


def test_skip_releases_a_parked_key(database_url: str, amqp_url: str) -> None:
    nowhere, elsewhere = unique_name("nowhere"), unique_name("elsewhere")
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, nowhere, {}, key="k", idempotency_key="poison")
        producers.publish(conn, elsewhere, {}, key="k", idempotency_key="next")
    with temp_queue(amqp_url, name=elsewhere) as q, RelayThread(database_url, amqp_url, max_attempts=1):
        wait_until(lambda: outbox_counts(database_url) == {"failed": 1, "pending": 1}, timeout=30)
        dead = json.loads(cli("dead", "--json", "--database-url", database_url).stdout)
        result = cli("skip", "--id", str(dead[0]["id"]), "--database-url", database_url)
        assert result.returncode == 0, result.stderr
        wait_until(lambda: outbox_counts(database_url) == {"skipped": 1}, timeout=30)
        assert [m.message_id for m in q.collect(1)] == ["next"]
    assert cli("skip", "--id", str(dead[0]["id"]), "--database-url", database_url).returncode == 1


def test_a_misrouted_event_shows_as_retrying_within_seconds_and_retry_sends_it_at_once(
    database_url: str, amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The relay reads its gauges at its usual pace, only faster: a retry shows at the next turn.
    monkeypatch.setattr("relay.progress.AGE_INTERVAL_SECONDS", 0.2)
    nowhere = unique_name("nowhere")
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, nowhere, {"n": 1}, key="k", idempotency_key="misrouted")
        event_id = conn.execute("SELECT id FROM outbox").fetchone()[0]  # type: ignore[index]
    # Backoffs as long as the defaults' later ones: without "retry now", the event would wait a minute.
    with RelayThread(database_url, amqp_url, max_attempts=10, backoff_initial_seconds=60, backoff_max_seconds=60) as r:
        metrics = r.relay.metrics if r.relay is not None else None
        assert metrics is not None
        started = time.monotonic()

        def shown() -> dict[str, Any]:
            status: dict[str, Any] = json.loads(cli("status", "--json", "--database-url", database_url).stdout)
            return status

        wait_until(lambda: shown()["retrying"] == 1, timeout=15)
        status = shown()
        [topic] = status["retrying_topics"]
        assert (topic["topic"], topic["event_id"], topic["attempts"]) == (nowhere, event_id, 1)
        assert "unroutable" in topic["last_error"] and topic["next_attempt_in_seconds"] > 30
        assert status["failed"] == 0 and status["oldest_retrying_age_seconds"] > 0
        inspected = cli("inspect", str(event_id), "--database-url", database_url).stdout
        assert "retrying: yes, 1 attempt so far" in inspected and f"retry --id {event_id}" in inspected
        gauge = f'outbox_relay_retrying{{topic="{nowhere}"}} 1.0'
        wait_until(lambda: gauge in metrics.render().decode(), timeout=10)
        assert time.monotonic() - started < 15  # seconds, where the dead letter took minutes

        with temp_queue(amqp_url, name=nowhere) as fixed:
            done = cli("retry", "--id", str(event_id), "--database-url", database_url)
            assert (done.returncode, done.stdout, done.stderr) == (0, "made 1 retrying events due now\n", "")
            assert [m.message_id for m in fixed.collect(1, timeout=15)] == ["misrouted"]
        wait_until(lambda: not outbox_counts(database_url), timeout=10)
