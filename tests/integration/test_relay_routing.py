"""Topic routing end to end: one relay, `billing.*` to RabbitMQ and everything else to Kafka."""

from __future__ import annotations

import time
from urllib.parse import urlsplit, urlunsplit

import psycopg

import producers
from devservers import free_port
from tests.integration.kafka_support import consume, unique_topic
from tests.integration.rabbit_support import TcpProxy, temp_exchange, temp_queue
from tests.relay_support import RelayThread, outbox_counts, wait_until


def at_port(amqp_url: str, port: int) -> str:
    """``amqp_url`` pointed at ``127.0.0.1:port``."""
    parts = urlsplit(amqp_url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit((parts.scheme, f"{userinfo}@127.0.0.1:{port}", parts.path, parts.query, ""))


def published_order(database_url: str, key: str) -> list[str]:
    """The key's events in the order the broker acknowledged them (kept with --keep-sent)."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT idempotency_key FROM outbox WHERE key = %s AND state = 'sent' ORDER BY published_at, id", [key]
        ).fetchall()
    return [row[0] for row in rows]


def rows(database_url: str, where: str) -> list[tuple[str, str, int]]:
    """(idempotency key, state, attempts) of the rows matching ``where``, by id."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute(f"SELECT idempotency_key, state, attempts FROM outbox WHERE {where} ORDER BY id")
        return [(str(k), str(s), int(a)) for k, s, a in found.fetchall()]


def test_each_topic_reaches_its_broker_once_and_a_key_stays_in_order_across_brokers(
    database_url: str, amqp_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic("routed")
    billing = ["billing.invoiced", "billing.paid"]
    with psycopg.connect(database_url) as conn:
        # One account whose events alternate between the two brokers.
        for n in range(6):
            target = billing[n // 2 % 2] if n % 2 == 0 else topic
            producers.publish(conn, target, {"n": n}, key="acct", idempotency_key=f"a{n}")
        for n in range(10):
            producers.publish(conn, billing[n % 2], {"n": n}, idempotency_key=f"b{n}")
            producers.publish(conn, topic, {"n": n}, key=f"k{n % 3}", idempotency_key=f"k{n}")
    with (
        temp_exchange(amqp_url) as exchange,
        temp_queue(amqp_url, exchange=exchange, routing_keys=billing) as queue,
        RelayThread(
            database_url, "", routes=[f"billing.*={amqp_url}?exchange={exchange}", f"*=kafka://{kafka_bootstrap}"],
            keep_sent=True,
        ) as relay,
    ):  # fmt: skip
        wait_until(lambda: outbox_counts(database_url) == {"sent": 26}, timeout=60)
        rabbit = queue.collect(13)
        assert relay.relay is not None
        gauges = [line for line in relay.relay.metrics.render().decode().splitlines() if "sink_up{" in line]
    kafka = consume(kafka_bootstrap, topic, count=13, settle_seconds=1.0)

    rabbit_ids = [m.message_id or "" for m in rabbit]
    kafka_ids = [m.headers["idempotency-key"].decode() for m in kafka]
    assert sorted(rabbit_ids) == sorted(["a0", "a2", "a4"] + [f"b{n}" for n in range(10)])
    assert sorted(kafka_ids) == sorted(["a1", "a3", "a5"] + [f"k{n}" for n in range(10)])
    assert {m.routing_key for m in rabbit} <= set(billing)
    # Each broker saw the key in order, and across both the acknowledgements came in write order.
    assert [i for i in rabbit_ids if i.startswith("a")] == ["a0", "a2", "a4"]
    assert [i for i in kafka_ids if i.startswith("a")] == ["a1", "a3", "a5"]
    assert published_order(database_url, "acct") == [f"a{n}" for n in range(6)]
    assert len(gauges) == 2 and all(line.endswith(" 1.0") for line in gauges), gauges
    assert not [line for line in gauges if "guest:guest" in line], "sink labels hide passwords"


def test_a_down_route_holds_back_only_its_events_until_its_broker_returns(
    database_url: str, amqp_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic("routed")
    port = free_port()  # nothing listens here yet: connections are refused
    amqp = urlsplit(amqp_url)
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "billing.paid", {"n": 0}, key="acct", idempotency_key="acct-paid")
        producers.publish(conn, topic, {"n": 1}, key="acct", idempotency_key="acct-shipped")
        for n in range(3):
            producers.publish(conn, "billing.paid", {"n": n}, idempotency_key=f"b{n}")
        for n in range(10):
            producers.publish(conn, topic, {"n": n}, key=f"k{n % 3}", idempotency_key=f"k{n}")
    with (
        temp_exchange(amqp_url) as exchange,
        temp_queue(amqp_url, exchange=exchange, routing_keys=["billing.paid"]) as queue,
        RelayThread(
            database_url, "",
            routes=[f"billing.*={at_port(amqp_url, port)}?exchange={exchange}", f"*=kafka://{kafka_bootstrap}"],
            keep_sent=True,
        ) as relay,
    ):  # fmt: skip
        # The Kafka route delivers while RabbitMQ is away ...
        wait_until(lambda: outbox_counts(database_url).get("sent") == 10, timeout=60)
        assert relay.relay is not None
        # ... and the billing events wait, attempts unspent, with the key's later event behind them.
        held = ["acct-paid", "acct-shipped", "b0", "b1", "b2"]
        wait_until(
            lambda: rows(database_url, "state <> 'sent'") == [(i, "pending", 0) for i in held],
            timeout=20,
        )
        # Still so after a few rounds of probing RabbitMQ and claiming the events again.
        time.sleep(3)
        wait_until(lambda: rows(database_url, "state <> 'sent'") == [(i, "pending", 0) for i in held], timeout=20)
        assert relay.relay.metrics.failed_attempts._value.get() == 0
        gauges = [line for line in relay.relay.metrics.render().decode().splitlines() if "sink_up{" in line]
        assert any(str(port) in line and line.endswith(" 0.0") for line in gauges), gauges
        assert any("kafka://" in line and line.endswith(" 1.0") for line in gauges), gauges

        with TcpProxy(amqp.hostname or "127.0.0.1", amqp.port or 5672, listen_port=port):
            wait_until(lambda: outbox_counts(database_url) == {"sent": 15}, timeout=60)
            rabbit = queue.collect(4)
            relay.stop()
    kafka = consume(kafka_bootstrap, topic, count=11, settle_seconds=1.0)
    assert sorted(m.message_id or "" for m in rabbit) == ["acct-paid", "b0", "b1", "b2"]
    assert sorted(m.headers["idempotency-key"].decode() for m in kafka) == sorted(
        ["acct-shipped"] + [f"k{n}" for n in range(10)]
    )
    assert published_order(database_url, "acct") == ["acct-paid", "acct-shipped"]
    assert rows(database_url, "key = 'acct'") == [("acct-paid", "sent", 1), ("acct-shipped", "sent", 1)]
