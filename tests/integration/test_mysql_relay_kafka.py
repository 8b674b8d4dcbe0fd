"""The relay end to end on MariaDB (MySQL 8 dialect): the outbox table to the Tansu broker."""

from __future__ import annotations

import base64
import json
import random
import time
import uuid

import pytest
from confluent_kafka import Consumer, Message, TopicPartition

import producers
from devservers import FIRST_OFFSET
from tests import mysql_support
from tests.acceptance.cli import cli
from tests.integration.kafka_support import Received, consume, offset_gaps, unique_topic
from tests.relay_support import RelayThread, wait_until

KEYS = 20


def write(url: str, topic: str, transactions: int, *, seed: int) -> tuple[set[str], set[str]]:
    """Writers in ``transactions`` transactions, by ``publish()`` and by plain SQL, about 30% rolled back.

    Each transaction also writes a business row. Returns the idempotency keys
    committed and rolled back.
    """
    rng = random.Random(seed)
    committed: set[str] = set()
    rolled_back: set[str] = set()
    conn = mysql_support.connect(url, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS orders (id INT PRIMARY KEY)")
        conn.commit()
        for t in range(seed * 10_000, seed * 10_000 + transactions):
            written = []
            with conn.cursor() as cur:
                cur.execute("INSERT INTO orders (id) VALUES (%s)", [t])
                for i in range(rng.randint(1, 4)):
                    idem, key = f"t{t}-{i}", f"k{rng.randrange(KEYS)}" if i % 3 else None
                    payload = {"t": t, "i": i, "key": key}
                    if rng.random() < 0.5:
                        producers.publish(conn, topic, payload, key=key, idempotency_key=idem)
                    else:
                        cur.execute(
                            "INSERT INTO outbox (topic, `key`, payload, idempotency_key) VALUES (%s, %s, %s, %s)",
                            [topic, key, json.dumps(payload), idem],
                        )
                    written.append(idem)
            if rng.random() < 0.3:
                conn.rollback()
                rolled_back.update(written)
            else:
                conn.commit()
                committed.update(written)
    finally:
        conn.close()
    return committed, rolled_back


def in_key_order(received: list[Received]) -> dict[bytes, list[tuple[int, int]]]:
    by_key: dict[bytes, list[tuple[int, int]]] = {}
    for m in sorted(received, key=lambda m: (m.partition, m.offset)):
        if m.key is not None:
            body = json.loads(m.value)
            by_key.setdefault(m.key, []).append((body["t"], body["i"]))
    return by_key


@pytest.mark.timeout(180)
def test_committed_events_arrive_once_in_key_order_and_rolled_back_ones_never(
    mysql_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic()
    before, rolled_before = write(mysql_url, topic, 100, seed=1)  # a backlog, then more while it relays
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}"):
        more, rolled_more = write(mysql_url, topic, 100, seed=2)
        committed = before | more
        wait_until(lambda: not mysql_support.outbox_counts(mysql_url), timeout=60)
        received = consume(kafka_bootstrap, topic, count=len(committed), settle_seconds=1.0)
    rolled_back = rolled_before | rolled_more
    assert rolled_back and committed, "the writers must both commit and roll back"
    ids = [m.headers["idempotency-key"].decode() for m in received]
    assert len(ids) == len(set(ids)), "no duplicates without failures"
    assert set(ids) == committed
    assert not set(ids) & rolled_back
    for key, order in in_key_order(received).items():
        assert order == sorted(order), f"key {key!r} out of order"


def test_headers_key_and_payload_arrive_as_written(mysql_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        producers.publish(
            conn, topic, {"order": 1, "é": "ü"}, key="order-1", headers={"trace": "abc"}, idempotency_key="created"
        )
        conn.commit()
    finally:
        conn.close()
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}"):
        wait_until(lambda: not mysql_support.outbox_counts(mysql_url))
        [message] = consume(kafka_bootstrap, topic, count=1)
    assert message.key == b"order-1"
    assert json.loads(message.value) == {"order": 1, "é": "ü"}
    assert message.headers == {"trace": b"abc", "idempotency-key": b"created"}


def test_two_relays_share_the_work_and_keep_each_key_in_order(mysql_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    with (
        RelayThread(mysql_url, f"kafka://{kafka_bootstrap}") as a,
        RelayThread(mysql_url, f"kafka://{kafka_bootstrap}") as b,
    ):
        conn = mysql_support.connect(mysql_url)
        try:
            with conn.cursor() as cur:
                # Twenty commits, each after the relays have gone idle: without NOTIFY, a relay
                # that is busy claims again at once while an idle one polls, and would take a
                # backlog written in one go all to itself.
                for start in range(0, 2000, 100):
                    cur.executemany(
                        "INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)",
                        [
                            (topic, f"k{n % 50}" if n % 2 == 0 else None, json.dumps({"t": n, "i": 0}))
                            for n in range(start, start + 100)
                        ],
                    )
                    time.sleep(0.25)
        finally:
            conn.close()
        wait_until(lambda: not mysql_support.outbox_counts(mysql_url), timeout=60)
    received = consume(kafka_bootstrap, topic, count=2000, settle_seconds=1.0)
    numbers = [json.loads(m.value)["t"] for m in received]
    assert a.relay is not None and b.relay is not None
    published = [r.metrics.published.labels(topic)._value.get() for r in (a.relay, b.relay)]
    missing = sorted(set(range(2000)) - set(numbers))
    assert sorted(numbers) == list(range(2000)), (
        f"every event once: missing {missing[:20]}, read {len(numbers)}; the relays published {published}; "
        f"offsets not read below the highest read {offset_gaps(received)}"
    )
    assert sum(published) == 2000 and min(published) > 0, published
    for key, order in in_key_order(received).items():
        assert order == sorted(order), f"key {key!r} out of order"


#: Not UTF-8 (a lone continuation byte, an invalid two-byte sequence), with NUL and every other byte value.
NOT_UTF8 = b"\x80\xc3\x28" + bytes(range(256))


def messages_of(bootstrap: str, topic: str, count: int) -> list[Message]:
    """The topic's first ``count`` messages, as the broker has them (headers as a list: a duplicate would show)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bytes-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, FIRST_OFFSET) for p in partitions])
        messages: list[Message] = []
        while len(messages) < count:
            message = consumer.poll(10)
            assert message is not None, f"only {len(messages)} messages arrived"
            assert message.error() is None, message.error()
            messages.append(message)
        return messages
    finally:
        consumer.close()


def test_bytes_reach_kafka_exactly_with_a_content_type_header(mysql_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        # All of one key, so that they arrive in this order.
        producers.publish(
            conn, topic, NOT_UTF8, key="k", content_type="application/x-protobuf", idempotency_key="pb",
            headers={"Content-Type": "text/plain", "trace": "t1"},  # the column wins over a row header
        )  # fmt: skip
        producers.publish(conn, topic, b"", key="k", idempotency_key="empty")  # application/octet-stream
        producers.publish(conn, topic, {"json": "é"}, key="k", idempotency_key="json", headers={"trace": "t2"})
        with conn.cursor() as cur:  # plain SQL, as docs/bytes.md shows it for MySQL
            cur.execute(
                "INSERT INTO outbox (topic, `key`, payload_bytes, content_type, idempotency_key)"
                " VALUES (%s, 'k', X'00ff', 'application/x-avro', 'sql')",
                [topic],
            )
        conn.commit()
    finally:
        conn.close()
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}"):
        wait_until(lambda: not mysql_support.outbox_counts(mysql_url))
    messages = messages_of(kafka_bootstrap, topic, 4)
    got = [(m.key(), m.value(), m.headers()) for m in messages]
    # A JSON payload as always: no content-type header (its text as publish() wrote it: "é" escaped).
    assert json.loads(got[2][1] or b"") == {"json": "é"}
    assert got == [
        (b"k", NOT_UTF8, [("trace", b"t1"), ("idempotency-key", b"pb"), ("content-type", b"application/x-protobuf")]),
        # An empty value, not a null one (a tombstone).
        (b"k", b"", [("idempotency-key", b"empty"), ("content-type", b"application/octet-stream")]),
        (b"k", got[2][1], [("trace", b"t2"), ("idempotency-key", b"json")]),
        (b"k", b"\x00\xff", [("idempotency-key", b"sql"), ("content-type", b"application/x-avro")]),
    ]


def test_admin_commands_show_and_replay_a_bytes_event(mysql_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    conn = mysql_support.connect(mysql_url, autocommit=False)
    try:
        producers.publish(conn, topic, NOT_UTF8, content_type="application/x-protobuf", idempotency_key="pb")
        conn.commit()
    finally:
        conn.close()
    [(event_id,)] = mysql_support.execute(mysql_url, "SELECT id FROM outbox")
    url = ["--database-url", mysql_url]

    shown = json.loads(cli("inspect", str(event_id), "--json", *url).stdout)
    assert (shown["payload"], shown["content_type"]) == (None, "application/x-protobuf")
    assert base64.b64decode(shown["payload_bytes"]) == NOT_UTF8
    assert f"payload_bytes: \\x{NOT_UTF8.hex()}\n" in cli("inspect", str(event_id), *url).stdout

    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}", keep_sent=True):
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {"sent": 1})
        result = cli("replay", "--all", *url)
        assert result.returncode == 0 and "replayed 1" in result.stdout, result
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {"sent": 1})
        messages = messages_of(kafka_bootstrap, topic, 2)
    assert [(m.value(), dict(m.headers() or [])["content-type"]) for m in messages] == [
        (NOT_UTF8, b"application/x-protobuf")
    ] * 2
