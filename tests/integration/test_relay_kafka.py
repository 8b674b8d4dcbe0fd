"""The relay end to end: PostgreSQL to the Tansu broker, in the contract's shape."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import producers
from tests.integration.kafka_support import consume, unique_topic
from tests.relay_support import RelayThread, outbox_counts, wait_until


def test_committed_events_arrive_in_the_contract_shape_and_rolled_back_ones_never(
    database_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic()
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            conn.execute("CREATE TABLE orders (id int primary key)")
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            producers.publish(
                conn,
                topic,
                {"order": 1, "é": "ü"},
                key="order-1",
                headers={"trace": "abc"},
                idempotency_key="order-1-created",
            )
            producers.publish(conn, topic, {"order": 1, "paid": True}, key="order-1", idempotency_key="order-1-paid")
            producers.publish(conn, topic, {"free": True}, idempotency_key="no-key")
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2)")
            producers.publish(conn, topic, {"order": 2}, key="order-2", idempotency_key="rolled-back")
            raise RuntimeError("business failure")
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}"):
        wait_until(lambda: not outbox_counts(database_url))
        received = consume(kafka_bootstrap, topic, count=3, settle_seconds=1.0)
    by_key = {m.headers["idempotency-key"].decode(): m for m in received}
    assert sorted(by_key) == ["no-key", "order-1-created", "order-1-paid"]
    created = by_key["order-1-created"]
    assert created.key == b"order-1"
    assert json.loads(created.value) == {"order": 1, "é": "ü"}
    assert created.headers == {"trace": b"abc", "idempotency-key": b"order-1-created"}
    assert by_key["no-key"].key is None
    paid = by_key["order-1-paid"]
    assert paid.partition == created.partition and paid.offset > created.offset


def test_future_deliver_at_is_not_published_before_its_time(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    due = datetime.now(UTC) + timedelta(seconds=2)
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, topic, {"later": True}, deliver_at=due, idempotency_key="later")
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}"):
        time.sleep(1.0)
        assert outbox_counts(database_url) == {"pending": 1}
        wait_until(lambda: not outbox_counts(database_url), timeout=15)
        arrived = datetime.now(UTC)
    assert arrived >= due
    assert [m.headers["idempotency-key"] for m in consume(kafka_bootstrap, topic, count=1)] == [b"later"]


def test_two_relays_deliver_every_event_exactly_once_without_crashes(database_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    with (
        RelayThread(database_url, f"kafka://{kafka_bootstrap}") as a,
        RelayThread(database_url, f"kafka://{kafka_bootstrap}") as b,
        psycopg.connect(database_url, autocommit=True) as conn,
    ):
        # Written while both relays run, in ten commits: a backlog written before
        # the second one started could all go to the first on a fast machine.
        for start in range(1, 3001, 300):
            conn.execute(
                "INSERT INTO outbox (topic, key, payload) SELECT %s, CASE WHEN g %% 2 = 0 THEN 'k' || (g %% 50) END,"
                " jsonb_build_object('n', g) FROM generate_series(%s::int, %s::int) g",
                [topic, start, start + 299],
            )
            time.sleep(0.02)
        wait_until(lambda: not outbox_counts(database_url), timeout=60)
    received = consume(kafka_bootstrap, topic, count=3000, settle_seconds=1.0)
    keys = [m.headers["idempotency-key"] for m in received]
    assert len(keys) == 3000 and len(set(keys)) == 3000, "no event may be published by both relays"
    assert a.relay is not None and b.relay is not None
    published = [r.metrics.published.labels(topic)._value.get() for r in (a.relay, b.relay)]
    assert sum(published) == 3000 and min(published) > 0, published
    by_key: dict[bytes, list[int]] = {}
    for m in sorted(received, key=lambda m: (m.partition, m.offset)):
        if m.key is not None:
            by_key.setdefault(m.key, []).append(json.loads(m.value)["n"])
    assert all(ns == sorted(ns) for ns in by_key.values())


def test_a_relay_without_listen_polls_at_its_interval_and_still_delivers(
    database_url: str, kafka_bootstrap: str
) -> None:
    # Without LISTEN the idle wait is the poll interval. It once returned at
    # once, and the relay claimed back to back, about a thousand empty claims
    # a second, enough to slow a busy database until the relay fell behind.
    topic = unique_topic()
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}", listen=False) as relay:
        assert relay.relay is not None
        claims = relay.relay.metrics.claims
        before = claims._value.get()
        time.sleep(1.0)
        idle_claims = claims._value.get() - before
        # Poll interval 0.05 s doubling to 0.2 s: about 6 claims in a second. A spin makes
        # hundreds, and a fixed 0.05 s without the backoff 20.
        assert idle_claims <= 12, f"{idle_claims:.0f} claims in one idle second"
        with psycopg.connect(database_url) as conn:
            producers.publish(conn, topic, {"n": 1}, idempotency_key="polled")
        wait_until(lambda: not outbox_counts(database_url), timeout=10)
    received = consume(kafka_bootstrap, topic, count=1)
    assert [m.headers["idempotency-key"] for m in received] == [b"polled"]
