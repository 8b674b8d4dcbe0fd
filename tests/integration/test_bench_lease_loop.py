"""The bench's lease-then-delete loops (bench/lease_loop.py) drain exactly the rows a relay could claim."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from bench import lease_loop
from bench import mysql as bench_mysql
from relay.events import IDEMPOTENCY_HEADER
from tests.integration.kafka_support import consume, unique_topic
from tests.mysql_support import execute, insert_many

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(("events", "batch", "depth"), [(2_500, 1_000, 2), (7, 1, 1), (1_000, 1_000, 3)])
def test_the_postgres_loop_deletes_every_claimable_row_and_no_other(
    database_url: str, events: int, batch: int, depth: int
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload)"
            " SELECT 't', CASE WHEN g %% 3 = 0 THEN NULL ELSE 'k' || (g %% 5) END, jsonb_build_object('g', g)"
            " FROM generate_series(1, %s) AS g",
            (events,),
        )
        # What no claim may take: a live lease of another relay, a dead letter, an event not due yet.
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, claim_token, lease_owner, lease_expires_at)"
            " VALUES ('t', 'k1', '{}', %s, 'other', now() + interval '1 hour')",
            (str(uuid.uuid4()),),
        )
        conn.execute("INSERT INTO outbox (topic, key, payload, state) VALUES ('t', 'k2', '{}', 'failed')")
        conn.execute("INSERT INTO outbox (topic, payload, deliver_at) VALUES ('t', '{}', now() + interval '1 hour')")
        result = lease_loop.l_lease(database_url, batch=batch, depth=depth)
        left = conn.execute("SELECT lease_owner, state, deliver_at > now() FROM outbox ORDER BY id").fetchall()
    assert result["events"] == events
    assert result["rate"] > 0
    assert left == [("other", "pending", False), (None, "failed", False), (None, "pending", True)]


@pytest.mark.parametrize(("events", "batch", "depth"), [(2_500, 1_000, 2), (7, 1, 1)])
def test_the_mysql_loop_deletes_every_claimable_row_and_no_other(
    mysql_url: str, events: int, batch: int, depth: int
) -> None:
    insert_many(
        mysql_url,
        "INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)",
        [("t", None if g % 3 == 0 else f"k{g % 5}", f'{{"g": {g}}}') for g in range(events)],
    )
    execute(
        mysql_url,
        "INSERT INTO outbox (topic, `key`, payload, claim_token, lease_owner, lease_expires_at)"
        " VALUES ('t', 'k1', '{}', %s, 'other', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        (str(uuid.uuid4()),),
    )
    execute(mysql_url, "INSERT INTO outbox (topic, `key`, payload, state) VALUES ('t', 'k2', '{}', 'failed')")
    execute(
        mysql_url,
        "INSERT INTO outbox (topic, payload, deliver_at) VALUES ('t', '{}', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
    )
    result = lease_loop.l_steps_mysql(lambda: bench_mysql.connect(mysql_url), batch=batch, depth=depth)
    left = execute(mysql_url, "SELECT lease_owner, state, deliver_at > UTC_TIMESTAMP(6) FROM outbox ORDER BY id")
    assert result["events"] == events
    assert result["rate"] > 0
    # No lease is an empty owner on MySQL (relay/store/mysql/migrations/0007).
    assert [tuple(row) for row in left] == [("other", "pending", 0), ("", "failed", 0), ("", "pending", 1)]


@pytest.mark.parametrize(("batch", "depth"), [(1_000, 2), (3, 1)])
def test_the_keyed_mysql_loop_deletes_every_key_in_order_and_nothing_behind_another_event(
    mysql_url: str, batch: int, depth: int
) -> None:
    # What no stateless claim may take: an event whose key has an earlier dead letter ('kd'), or an earlier
    # event leased to another relay ('kl'); events of one key are deleted in id order, in batches of one each.
    execute(mysql_url, "INSERT INTO outbox (topic, `key`, payload, state) VALUES ('t', 'kd', '{}', 'failed')")
    execute(
        mysql_url,
        "INSERT INTO outbox (topic, `key`, payload, claim_token, lease_owner, lease_expires_at)"
        " VALUES ('t', 'kl', '{}', %s, 'other', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        (str(uuid.uuid4()),),
    )
    events = [("t", None if g % 7 == 0 else f"k{g % 5}", f'{{"g": {g}}}') for g in range(600)]
    insert_many(mysql_url, "INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", events)
    insert_many(
        mysql_url,
        "INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)",
        [("t", key, "{}") for key in ("kd", "kl", "kd")],
    )
    deleted: list[tuple[list[int], str]] = []
    settle = lease_loop.MYSQL_SETTLE

    class Noting:
        """The settle's connection, noting each batch it deletes."""

        def __init__(self) -> None:
            self.conn = bench_mysql.connect(mysql_url)

        def cursor(self) -> Any:
            cur = self.conn.cursor()
            execute_now = cur.execute

            def noted(query: str, args: Any = None) -> Any:
                if query == settle:
                    deleted.append((list(args[0]), args[1]))
                return execute_now(query, args)

            cur.execute = noted
            return cur

        def __getattr__(self, name: str) -> Any:
            return getattr(self.conn, name)

    connections = [bench_mysql.connect(mysql_url), Noting()]
    result = lease_loop.l_keyed_steps_mysql(lambda: connections.pop(0), batch=batch, depth=depth)
    left = execute(mysql_url, "SELECT `key`, state, lease_owner FROM outbox ORDER BY id")
    assert result["events"] == 600
    assert [tuple(row) for row in left] == [
        (b"kd", "failed", ""),
        (b"kl", "pending", "other"),
        (b"kd", "pending", ""),
        (b"kl", "pending", ""),
        (b"kd", "pending", ""),
    ]
    keys = {i + 3: key for i, (_, key, _) in enumerate(events)}  # ids 3 to 602: after the two rows above
    order = [i for ids, _ in deleted for i in ids]
    assert sorted(order) == list(keys)
    for key in {key for key in keys.values() if key is not None}:
        ids = [i for i in order if keys[i] == key]
        assert ids == sorted(ids)
        # One event of a key a batch: its next waits for the delete.
        assert all(sum(keys[i] == key for i in batch_ids) <= 1 for batch_ids, _ in deleted)


def test_the_kafka_loop_delivers_every_claimable_row_before_deleting_it(
    database_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic("lease-loop")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload)"
            " SELECT %s, CASE WHEN g %% 4 = 0 THEN NULL ELSE 'k' || (g %% 7) END, jsonb_build_object('g', g)"
            " FROM generate_series(1, 1500) AS g",
            (topic,),
        )
        conn.execute("INSERT INTO outbox (topic, payload, state) VALUES (%s, '{}', 'failed')", (topic,))
        written = conn.execute(
            "SELECT key, payload::text, idempotency_key FROM outbox WHERE state = 'pending'"
        ).fetchall()
        result = lease_loop.l_lease_kafka(database_url, kafka_bootstrap, batch=400, depth=2)
        left = conn.execute("SELECT state FROM outbox").fetchall()
    received = consume(kafka_bootstrap, topic, count=1500)
    assert result["events"] == 1500 and left == [("failed",)]
    got = {
        m.headers[IDEMPOTENCY_HEADER].decode(): (m.key.decode() if m.key is not None else None, m.value.decode())
        for m in received
    }
    assert len(received) == 1500
    assert got == {idempotency_key: (key, payload) for key, payload, idempotency_key in written}


def test_the_keyed_mysql_loop_stops_claiming_after_its_time_and_counts_what_it_deleted(mysql_url: str) -> None:
    # Over 2 keys the floor leases 2 events a claim and waits for their delete: 2,000 events take far longer
    # than the 0.3 s it is given, and what it deleted by then is what its rate counts.
    events = [("t", f"k{g % 2}", f'{{"g": {g}}}') for g in range(2_000)]
    insert_many(mysql_url, "INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", events)
    result = lease_loop.l_keyed_steps_mysql(lambda: bench_mysql.connect(mysql_url), seconds=0.3)
    ((left,),) = execute(mysql_url, "SELECT COUNT(*) FROM outbox")
    assert 0 < result["events"] < 2_000
    assert result["events"] + left == 2_000
    assert result["seconds"] >= 0.3 and result["rate"] == result["events"] / result["seconds"]
