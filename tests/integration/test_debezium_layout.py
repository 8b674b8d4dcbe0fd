"""Debezium's outbox table, written as a Debezium user writes it, relayed as Debezium's event router would."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import uuid
from collections import defaultdict
from typing import Any

import psycopg
import pytest

from relay.config import TableLayout, TableName
from relay.errors import SchemaError
from relay.store import sql as named
from tests.acceptance.cli import cli
from tests.integration.kafka_support import consume
from tests.integration.rabbit_support import temp_exchange, temp_queue
from tests.relay_support import RelayThread, wait_until

#: Debezium's default outbox table, as its documentation gives it.
CREATE = """
    CREATE TABLE {name} (
        id            uuid         NOT NULL PRIMARY KEY,
        aggregatetype varchar(255) NOT NULL,
        aggregateid   varchar(255) NOT NULL,
        type          varchar(255) NOT NULL,
        payload       {payload}
    )"""
INSERT = "INSERT INTO {name} (id, aggregatetype, aggregateid, type, payload) VALUES (%s, %s, %s, %s, %s)"


def execute(url: str, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)  # the test's own SQL
        return cur.fetchall() if cur.description else []


def columns(url: str, table: str) -> list[tuple[Any, ...]]:
    return execute(
        url,
        "SELECT column_name, data_type, is_nullable, column_default, ordinal_position"
        " FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        [table],
    )


def migrate(url: str, table: str) -> str:
    result = cli("migrate", "--database-url", url, "--table", table, "--table-layout", "debezium")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_debezium_table_is_relayed_with_the_event_routers_topics_keys_values_and_headers(
    database_url: str, kafka_bootstrap: str
) -> None:
    order, customer = f"Order{uuid.uuid4().hex[:8]}", f"Customer{uuid.uuid4().hex[:8]}"
    execute(database_url, CREATE.format(name="outboxevent", payload="jsonb"))
    # Rows written before the switch went out through Debezium: the relay leaves them.
    for i in range(3):
        execute(database_url, INSERT.format(name="outboxevent"), [uuid.uuid4(), order, "old", "Old", f'{{"i": {i}}}'])
    assert "applied 1001" in migrate(database_url, "outboxevent")

    written: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)  # key -> [(topic type, id, type, payload)]
    with psycopg.connect(database_url) as conn:
        for n in range(60):  # interleaved aggregates of two types, in several transactions
            kind, key = (order, f"o-{n % 4}") if n % 3 else (customer, f"c-{n % 2}")
            event_id, event_type, payload = uuid.uuid4(), f"Created{n}", json.dumps({"n": n, "é": [1, None]})
            conn.execute(INSERT.format(name="outboxevent"), [event_id, kind, key, event_type, payload])
            written[key].append((kind, str(event_id), event_type, payload))
            if n % 7 == 0:
                conn.commit()
        # A second write of an event id is dropped, as a Debezium user dedups.
        first_id = written["o-1"][0][1]
        conn.execute(
            "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)"
            " VALUES (%s, %s, 'o-1', 'Again', '{}') ON CONFLICT (id) DO NOTHING",
            [first_id, order],
        )
    layout = TableLayout.parse("debezium", field_headers=["type=eventType"])
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}", table="outboxevent", layout=layout):
        wait_until(lambda: execute(database_url, "SELECT count(*) FROM outboxevent") == [(3,)])
        received = consume(kafka_bootstrap, [f"outbox.event.{order}", f"outbox.event.{customer}"], count=60)

    assert len(received) == 60
    got: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    for m in received:
        assert m.key is not None and m.topic.startswith("outbox.event.")
        assert set(m.headers) == {"id", "eventType", "idempotency-key"}
        assert m.headers["idempotency-key"] == m.headers["id"]
        value = json.loads(m.value)
        got[m.key.decode()].append(
            (m.topic.removeprefix("outbox.event."), m.headers["id"].decode(), m.headers["eventType"].decode(), value)
        )
    # Each aggregate's events in the order written (Kafka keeps it per partition, and a key has one).
    assert {key: [(k, i, t, json.loads(p)) for k, i, t, p in events] for key, events in written.items()} == got
    # The value is the payload as PostgreSQL prints jsonb, byte for byte.
    printed = execute(database_url, "SELECT %s::jsonb::text", [written["c-0"][0][3]])[0][0]
    assert next(m.value for m in received if m.headers["id"].decode() == written["c-0"][0][1]) == printed.encode()
    assert execute(database_url, "SELECT DISTINCT relay_state, aggregateid FROM outboxevent") == [("sent", "old")]


@pytest.mark.parametrize(
    ("payload_type", "payload", "value", "content_type"),
    [
        ("json", '{"b":  1, "a": 2}', b'{"b":  1, "a": 2}', None),  # json keeps the text as written
        ("text", "plain text, not JSON: é", "plain text, not JSON: é".encode(), b"text/plain; charset=utf-8"),
        ("bytea", b"\x00\xff\x80", b"\x00\xff\x80", b"application/octet-stream"),
        ("bytea", b"", b"", b"application/octet-stream"),  # empty bytes are still bytes
        ("jsonb", None, b"", None),  # a null payload: an empty value, not a tombstone, with no content type
        ("json", None, b"", None),
        ("text", None, b"", None),
        ("bytea", None, b"", None),
    ],
)
def test_every_payload_type_goes_out_as_written(
    database_url: str, kafka_bootstrap: str, payload_type: str, payload: object, value: bytes, content_type: bytes
) -> None:
    kind = f"T{uuid.uuid4().hex[:8]}"
    execute(database_url, CREATE.format(name="events", payload=payload_type))
    migrate(database_url, "events")
    event_id = uuid.uuid4()
    execute(database_url, INSERT.format(name="events"), [event_id, kind, "k", "Done", payload])
    layout = TableLayout.parse("debezium", topic_template="shop.{aggregatetype}.events")
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}", table="events", layout=layout):
        wait_until(lambda: execute(database_url, "SELECT count(*) FROM events") == [(0,)])
        (message,) = consume(kafka_bootstrap, f"shop.{kind}.events", count=1)
    assert (message.key, message.value, message.headers.get("id")) == (b"k", value, str(event_id).encode())
    assert message.headers.get("content-type") == content_type


@pytest.mark.parametrize(
    ("payload_type", "payload", "data"),
    [
        ("jsonb", '{"a": [1, "é"]}', {"a": [1, "é"]}),
        ("json", "[1,  2]", [1, 2]),
        ("text", "hello world", b"hello world"),  # not JSON: as bytes, in data_base64
        ("text", "", b""),
        ("text", None, None),  # a null payload: an event without data
        ("jsonb", None, None),
        ("json", None, None),
        ("bytea", None, None),
        ("bytea", b"\x00\xff", b"\x00\xff"),
    ],
)
def test_structured_cloudevents_from_every_payload_type_are_json_documents(
    database_url: str, kafka_bootstrap: str, payload_type: str, payload: object, data: object
) -> None:
    kind = f"T{uuid.uuid4().hex[:8]}"
    execute(database_url, CREATE.format(name="events", payload=payload_type))
    migrate(database_url, "events")
    execute(database_url, INSERT.format(name="events"), [uuid.uuid4(), kind, "k", "Done", payload])
    layout = TableLayout.parse("debezium", topic_template="ce.{aggregatetype}")
    sink = f"kafka://{kafka_bootstrap}?format=cloudevents-structured"
    with RelayThread(database_url, sink, table="events", layout=layout):
        wait_until(lambda: execute(database_url, "SELECT count(*) FROM events") == [(0,)])
        (message,) = consume(kafka_bootstrap, f"ce.{kind}", count=1)
    envelope = json.loads(message.value)
    if data is None:
        assert "data" not in envelope and "data_base64" not in envelope and "datacontenttype" not in envelope
    elif isinstance(data, bytes):
        assert base64.b64decode(envelope["data_base64"]) == data
    else:
        assert envelope["data"] == data and envelope["datacontenttype"] == "application/json"


#: An application's own Debezium table, whose columns may be null (Debezium's own declares them NOT NULL).
CREATE_NULLABLE = """
    CREATE TABLE {name} (
        id            uuid         NOT NULL PRIMARY KEY,
        aggregatetype varchar(255),
        aggregateid   varchar(255),
        type          varchar(255),
        payload       jsonb
    )"""


@pytest.mark.parametrize(
    ("sink", "chosen"),
    [("kafka", "native"), ("kafka", "cloudevents"), ("amqp", "native"), ("amqp", "cloudevents-structured")],
)
def test_a_row_without_a_topic_is_dead_lettered_and_the_rest_flows(
    database_url: str, kafka_bootstrap: str, amqp_url: str, sink: str, chosen: str
) -> None:
    # A null aggregatetype (whatever the template), or an empty one with --topic-template {aggregatetype},
    # leaves no topic: no Kafka topic, routing key or CloudEvents type is empty. Such a row crashed the relay.
    kind = f"T{uuid.uuid4().hex[:8]}"
    execute(database_url, CREATE_NULLABLE.format(name="events"))
    migrate(database_url, "events")
    rows = [  # (aggregatetype, aggregateid, payload n), in order
        (kind, "a", 0),
        (None, "b", 1),  # dead
        (kind, "b", 2),  # parked behind it
        ("", "c", 3),  # dead
        (None, None, 4),  # dead, no key to park
        (kind, None, 5),
        (kind, "d", 6),
    ]
    for aggregatetype, aggregateid, n in rows:
        execute(
            database_url,
            INSERT.format(name="events"),
            [uuid.uuid4(), aggregatetype, aggregateid, None, f'{{"n": {n}}}'],
        )
    layout = TableLayout.parse("debezium", topic_template="{aggregatetype}")
    with contextlib.ExitStack() as stack:
        if sink == "kafka":
            url = f"kafka://{kafka_bootstrap}?format={chosen}"
        else:
            exchange = stack.enter_context(temp_exchange(amqp_url))
            queue = stack.enter_context(temp_queue(amqp_url, exchange=exchange, routing_keys=[kind, ""]))
            url = f"{amqp_url}?exchange={exchange}&format={chosen}"
        with RelayThread(database_url, url, table="events", layout=layout, max_attempts=5):
            wait_until(
                lambda: (
                    execute(database_url, "SELECT relay_state, count(*) FROM events GROUP BY 1 ORDER BY 1")
                    == [("failed", 3), ("pending", 1)]
                )
            )
            if sink == "kafka":
                values = [m.value for m in consume(kafka_bootstrap, kind, count=3)]
            else:
                values = [m.body for m in queue.collect(3)]
    dead = execute(database_url, "SELECT relay_attempts, relay_last_error FROM events WHERE relay_state = 'failed'")
    assert [attempts for attempts, _ in dead] == [1, 1, 1]  # at once: no retry can give it a topic
    assert all("the topic is empty" in error for _, error in dead)
    if chosen == "cloudevents-structured":
        values = [json.dumps(json.loads(value)["data"]).encode() for value in values]
    assert sorted(json.loads(value)["n"] for value in values) == [0, 5, 6]


@pytest.mark.parametrize("payload_type", ["bytea", "text", "jsonb"])
def test_migrate_rebuilds_a_view_an_earlier_release_made(database_url: str, payload_type: str) -> None:
    # Releases before this one gave a null bytea payload application/octet-stream: migrate
    # replaces the view whatever it holds, so running it again is the whole upgrade.
    execute(database_url, CREATE.format(name="events", payload=payload_type))
    migrate(database_url, "events")
    view = execute(database_url, "SELECT pg_get_viewdef('events_relay')")[0][0]
    stale, found = re.subn(r"(CASE\s[^,]*?END|NULL::text) AS content_type", "'stale'::text AS content_type", view)
    assert found == 1
    execute(database_url, f"CREATE OR REPLACE VIEW events_relay AS {stale}")
    execute(database_url, INSERT.format(name="events"), [uuid.uuid4(), "Order", "k", "Done", None])
    assert execute(database_url, "SELECT content_type FROM events_relay") == [("stale",)]
    migrate(database_url, "events")
    assert execute(database_url, "SELECT payload_bytes, content_type FROM events_relay") == [(b"", None)]


def test_migrate_adds_only_the_relays_columns_and_never_rewrites_the_table(database_url: str) -> None:
    execute(database_url, CREATE.format(name="shop_outbox", payload="jsonb"))
    execute(database_url, "ALTER TABLE shop_outbox ADD COLUMN tenant text DEFAULT 'acme'")
    execute(
        database_url,
        "INSERT INTO shop_outbox (id, aggregatetype, aggregateid, type, payload)"
        " SELECT gen_random_uuid(), 'Order', 'o-' || g, 'Created', jsonb_build_object('g', g)"
        " FROM generate_series(1, 5000) g",
    )
    before = columns(database_url, "shop_outbox")
    file_before = execute(database_url, "SELECT pg_relation_filenode('shop_outbox')")

    migrate(database_url, "shop_outbox")
    assert "up to date" in migrate(database_url, "shop_outbox")

    after = columns(database_url, "shop_outbox")
    assert [c for c in after if not c[0].startswith("relay_")] == before
    assert {c[0] for c in after} - {c[0] for c in before} == {
        "relay_seq", "relay_state", "relay_attempts", "relay_last_error", "relay_lease_owner", "relay_claim_token",
        "relay_lease_expires_at", "relay_deliver_at", "relay_priority", "relay_created_at", "relay_published_at",
        "relay_failed_at",
    }  # fmt: skip
    assert execute(database_url, "SELECT pg_relation_filenode('shop_outbox')") == file_before
    assert execute(database_url, "SELECT relay_state, count(*) FROM shop_outbox GROUP BY 1") == [("sent", 5000)]
    # Those rows have no place in the order: replay and purge leave them.
    admin = ["--database-url", database_url, "--table", "shop_outbox", "--table-layout", "debezium"]
    assert "replayed 0 events" in cli("replay", "--all", *admin).stdout
    assert "purged 0 events" in cli("purge", "--older-than", "0s", *admin).stdout
    # New rows are the relay's to send, in order.
    execute(database_url, INSERT.format(name="shop_outbox"), [uuid.uuid4(), "Order", "o-1", "Paid", "{}"])
    assert execute(database_url, "SELECT relay_state, relay_seq IS NOT NULL FROM shop_outbox WHERE type = 'Paid'") == [
        ("pending", True)
    ]


def test_migrate_creates_a_missing_table_as_debezium_documents_it(empty_database: str) -> None:
    migrate(empty_database, "outboxevent")
    assert [c[:3] for c in columns(empty_database, "outboxevent") if not c[0].startswith("relay_")] == [
        ("id", "uuid", "NO"),
        ("aggregatetype", "character varying", "NO"),
        ("aggregateid", "character varying", "NO"),
        ("type", "character varying", "NO"),
        ("payload", "jsonb", "YES"),
    ]


def test_a_table_that_is_not_debeziums_is_refused_in_one_line(database_url: str) -> None:
    result = cli("migrate", "--database-url", database_url, "--table-layout", "debezium")  # the native outbox
    assert result.returncode != 0
    assert "is not a Debezium outbox table" in result.stderr and "Traceback" not in result.stderr


def test_retries_dead_letters_parking_and_the_admin_commands_work_as_on_the_native_table(
    database_url: str, amqp_url: str
) -> None:
    lost, fine = f"Lost{uuid.uuid4().hex[:8]}", f"Fine{uuid.uuid4().hex[:8]}"
    execute(database_url, CREATE.format(name="outboxevent", payload="jsonb"))
    migrate(database_url, "outboxevent")
    ids = [uuid.uuid4() for _ in range(3)]
    with psycopg.connect(database_url) as conn:
        conn.execute(INSERT.format(name="outboxevent"), [ids[0], lost, "k", "First", '{"n": 0}'])  # no queue yet
        conn.execute(INSERT.format(name="outboxevent"), [ids[1], lost, "k", "Second", '{"n": 1}'])  # parked behind it
        conn.execute(INSERT.format(name="outboxevent"), [ids[2], fine, "j", "Other", '{"n": 2}'])
    admin = ["--database-url", database_url, "--table", "outboxevent", "--table-layout", "debezium"]

    def status() -> dict[str, Any]:
        result = cli("status", "--json", *admin)
        assert result.returncode == 0, result.stderr
        return dict(json.loads(result.stdout))

    layout = TableLayout.parse("debezium")
    with (
        temp_queue(amqp_url, name=f"outbox.event.{fine}") as fine_queue,
        RelayThread(database_url, amqp_url, table="outboxevent", layout=layout, max_attempts=3) as relay,
    ):
        wait_until(lambda: status()["failed"] == 1 and status()["pending"] == 1, timeout=30)
        assert [json.loads(m.body) for m in fine_queue.collect(1)] == [{"n": 2}]
        assert relay.relay is not None and relay.relay.metrics.dead_lettered._value.get() == 1
        assert (status()["parked_keys"], status()["in_flight"]) == (1, 0)

        dead = json.loads(cli("dead", "--json", *admin).stdout)
        assert [(d["idempotency_key"], d["topic"], d["key"], d["attempts"], d["blocks_key"]) for d in dead] == [
            (str(ids[0]), f"outbox.event.{lost}", "k", 3, "k")
        ]
        shown = json.loads(cli("inspect", str(dead[0]["id"]), "--json", *admin).stdout)
        assert (shown["payload"], shown["headers"]["type"], shown["state"]) == ('{"n": 0}', "First", "failed")

        with temp_queue(amqp_url, name=f"outbox.event.{lost}") as fixed:
            result = cli("requeue", "--key", "k", *admin)
            assert result.returncode == 0 and "requeued 1" in result.stdout, result.stderr
            wait_until(lambda: execute(database_url, "SELECT count(*) FROM outboxevent") == [(0,)], timeout=30)
            messages = fixed.collect(2)
    assert [(m.message_id, m.headers["id"], json.loads(m.body)) for m in messages] == [
        (str(ids[0]), str(ids[0]), {"n": 0}),
        (str(ids[1]), str(ids[1]), {"n": 1}),
    ]


def test_the_claim_on_the_view_uses_the_tables_indexes(database_url: str) -> None:
    execute(database_url, CREATE.format(name="outboxevent", payload="jsonb"))
    migrate(database_url, "outboxevent")
    table = TableName.parse("outboxevent")
    claim = named.render(named.queries()["claim"], TableLayout.parse("debezium").relation(table))
    with psycopg.connect(database_url) as conn:
        conn.execute(
            """INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, relay_state)
               SELECT gen_random_uuid(), 'Order', 'k' || (g % 500), 'Created', '{}',
                      CASE WHEN g % 10 = 0 THEN 'pending' ELSE 'sent' END
               FROM generate_series(1, 20000) g"""
        )
        conn.execute("ANALYZE outboxevent")
        plans = []
        for after in (0, 15000):  # a full scan, and one from a keyset hint
            params: dict[str, object] = {
                "after": after, "limit": 100, "max_bytes": 16 * 2**20, "max_attempts": 5, "token": None,
                "owner": "x", "lease_seconds": 30, "mine": [], "tail_keys": [], "tail_ids": [], "tail_topics": [],
            }  # fmt: skip
            plans.append("\n".join(r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ") + claim, params)))
        conn.rollback()
    for plan in plans:
        assert "outboxevent_claim_idx" in plan, plan
        assert "outboxevent_key_idx" in plan, plan
        assert "Seq Scan" not in plan, plan


def test_the_layout_flags_fall_back_to_the_environment_and_fail_in_one_line(
    database_url: str, kafka_bootstrap: str
) -> None:
    execute(database_url, CREATE.format(name="outboxevent", payload="jsonb"))
    url = ["--database-url", database_url, "--table", "outboxevent"]
    assert "applied 1001" in cli("migrate", *url, RELAY_TABLE_LAYOUT="debezium").stdout
    shown = cli("status", "--json", *url, RELAY_TABLE_LAYOUT="debezium")
    assert shown.returncode == 0 and json.loads(shown.stdout)["pending"] == 0, shown.stderr

    for result, needle in [
        (cli("migrate", *url), "table outboxevent has Debezium's layout: pass --table-layout debezium"),
        (cli("status", *url, RELAY_TABLE_LAYOUT="cdc"), "unknown table layout 'cdc'"),
        (cli("status", *url, RELAY_TOPIC_TEMPLATE="a.{aggregatetype}"), "go with --table-layout debezium"),
        (
            cli(
                "run",
                *url,
                "--sink",
                f"kafka://{kafka_bootstrap}",
                RELAY_TABLE_LAYOUT="debezium",
                RELAY_FIELD_HEADERS="type=eventType,nope=x",
            ),
            "--field-header: table outboxevent has no column nope",
        ),
    ]:
        # One line names the problem (run logs its start-up before it).
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode != 0 and last.startswith("outbox-relay: error: ") and needle in last, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "column",
    [
        "payload",  # the value, never a header
        "relay_attempts",  # the relay's own
        "c48",  # past the first 49 of the table's own columns: the view has no room for it
        "late",  # added after the last migrate: the view does not read it yet
    ],
)
def test_a_field_header_no_record_would_carry_is_refused_at_start(
    database_url: str, kafka_bootstrap: str, column: str
) -> None:
    # Each was accepted and then never sent: the records went out without the header.
    execute(database_url, CREATE.format(name="outboxevent", payload="jsonb"))
    execute(database_url, "ALTER TABLE outboxevent " + ", ".join(f"ADD COLUMN c{i} text" for i in range(50)))
    migrate(database_url, "outboxevent")
    execute(database_url, "ALTER TABLE outboxevent ADD COLUMN late text")
    layout = TableLayout.parse("debezium", field_headers=["type=eventType", "c1=first", f"{column}=h"])
    relay = RelayThread(database_url, f"kafka://{kafka_bootstrap}", table="outboxevent", layout=layout)
    with pytest.raises(SchemaError, match=rf"--field-header: column {column} of table outboxevent is in no header"):
        relay.__enter__()
    # The columns a record can carry start as before.
    good = TableLayout.parse("debezium", field_headers=["type=eventType", "c1=first", "c45=last", "id=eventId"])
    with RelayThread(database_url, f"kafka://{kafka_bootstrap}", table="outboxevent", layout=good):
        pass


@pytest.mark.parametrize("command", [("status",), ("dead",), ("inspect", "1"), ("requeue", "--all")])
def test_a_wrong_table_layout_flag_is_named_in_the_error(database_url: str, command: tuple[str, ...]) -> None:
    # The relay's own table read as Debezium's, and Debezium's read as the relay's own.
    native = cli(*command, "--database-url", database_url, "--table-layout", "debezium")
    assert native.returncode == 1 and "drop the flag" in native.stderr, native.stderr
    execute(database_url, CREATE.format(name="outboxevent", payload="jsonb"))
    migrate(database_url, "outboxevent")
    debezium = cli(*command, "--database-url", database_url, "--table", "outboxevent")
    assert debezium.returncode == 1 and "pass --table-layout debezium" in debezium.stderr, debezium.stderr
