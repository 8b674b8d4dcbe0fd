"""Bad input: each case ends in a clear error or a dead letter with its reason,
while the rest keeps flowing, without a crash loop and without losing anything.

10. an unroutable RabbitMQ event: retried up to --max-attempts, then dead-lettered;
11. a payload larger than the broker (or the sink) accepts: dead-lettered at once;
12. headers that are not a JSON object of strings (refused at write time), or
    that set broker-reserved AMQP headers (dead-lettered, never forwarded);
13. an unknown Kafka topic on a broker that does not auto-create, and an invalid
    topic name: dead-lettered at once;
14. an outbox table name that tries SQL injection: refused before any connection;
15. a canary password in every URL never shows in any output or ``repr``;
16. hand-written malformed rows: the schema refuses them; a huge but valid
    payload inserts and is dead-lettered by the sink for its size.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

import producers
from devservers import free_port
from relay.app import RunConfig, build_relay, start
from relay.config import AmqpSinkConfig, RelaySettings, TableName, parse_sink_url
from relay.loop import Relay
from relay.sinks.rabbitmq import MAX_MESSAGE_BYTES, RabbitMQSink
from relay.store.migrate import migrate
from relay.store.postgres import PostgresStore
from tests.faults.checker import Delivery, KafkaCollector, Ledger, verdict
from tests.faults.conftest import FULL, Recorder
from tests.faults.test_process_faults import Tapped
from tests.faults.test_rabbitmq_faults import deliveries, drain_queue, durable_queue, queue_depth, rabbitmqctl
from tests.integration.kafka_support import consume, unique_topic
from tests.integration.rabbit_support import unique_name
from tests.relay_support import FAST, outbox_counts, relay_process, wait_until

CANARY = f"Canary-{uuid.uuid4().hex[:10]}"


# --- helpers -------------------------------------------------------------------


def cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """``outbox-relay ARGS`` with a clean environment plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_") and k != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=timeout,
        env={**base, **env}, check=False,
    )  # fmt: skip


def dead_letters(database_url: str, table: str = "outbox") -> dict[str, dict[str, Any]]:
    """``outbox-relay dead --json``, by idempotency key."""
    done = cli("dead", "--json", "--database-url", database_url, "--table", table)
    assert done.returncode == 0, done.stderr
    return {entry["idempotency_key"]: entry for entry in json.loads(done.stdout)}


def counts_are(database_url: str, table: str = "outbox", **expected: int) -> Callable[[], bool]:
    def check() -> bool:
        counts = outbox_counts(database_url, table)
        return all(counts.get(state, 0) == n for state, n in expected.items())

    return check


class Events:
    """Events written for one test, split into those that must arrive and those that must not."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.withheld: dict[str, str] = {}  # idempotency key -> why it must not arrive
        self.seqs: dict[str, int] = {}

    def good(self, conn: psycopg.Connection[Any], topic: str, key: str, seq: int, **kw: Any) -> str:
        idem = producers.publish(conn, topic, {"key": key, "seq": seq}, key=key, **kw)
        self.ledger.committed[idem] = (key, seq)
        return idem

    def bad(self, conn: psycopg.Connection[Any], topic: str, why: str, payload: Any = None, **kw: Any) -> str:
        idem = producers.publish(conn, topic, payload if payload is not None else {"bad": why}, **kw)
        self.withheld[idem] = why
        return idem

    def write_good(self, conn: psycopg.Connection[Any], topic: str, n: int, keys: int = 4) -> None:
        """``n`` events over ``keys`` keys, each key's seq going on from earlier calls."""
        for i in range(n):
            key = f"g{i % keys}"
            self.seqs[key] = self.seqs.get(key, 0) + 1
            self.good(conn, topic, key, self.seqs[key])


def assert_no_crash_loop(relay: Tapped, code: int, dead: int) -> None:
    log = relay.text()
    assert code == 0, log
    assert not re.search(r'File "[^"]*/relay/', log), log
    assert log.count("dead-lettered event") == dead, log


def relay_to_kafka_until(
    database_url: str, sink_url: str, bootstrap: str, topic: str, events: Events, *, failed: int, pending: int
) -> tuple[Tapped, int, dict[str, dict[str, Any]], list[Delivery]]:
    """Run a relay subprocess until ``failed`` events are dead-lettered and ``pending`` wait.

    Returns the relay, its exit code, the dead letters, and what ``topic``
    received once every committed event arrived (plus a second for strays).
    """
    relay = Tapped(relay_process(database_url, sink_url))
    with KafkaCollector(bootstrap, topic) as collector:
        try:
            wait_until(counts_are(database_url, failed=failed, pending=pending), timeout=60)
            dead = dead_letters(database_url)
            collector.wait_for(lambda ds: len(ds) >= len(events.ledger.committed), timeout=30)
            time.sleep(1.0)
        finally:
            code = relay.stop()
    return relay, code, dead, collector.deliveries


def run_in_process(relay: Relay, done: Callable[[], bool], timeout: float = 60) -> None:
    """Run ``relay`` on an event loop until ``done()`` (checked off the loop), then stop it."""

    async def main() -> None:
        stop = asyncio.Event()
        await start(relay, 10)
        task = asyncio.create_task(relay.run(stop))
        deadline = time.monotonic() + timeout
        try:
            while not await asyncio.to_thread(done):
                if task.done():
                    task.result()
                    raise AssertionError("the relay stopped by itself")
                if time.monotonic() > deadline:
                    raise AssertionError(f"condition not met within {timeout}s")
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await task

    asyncio.run(main())


# --- 10: unroutable ------------------------------------------------------------


@pytest.mark.timeout(120)
def test_10_an_unroutable_event_is_retried_then_dead_lettered_while_others_flow(
    database_url: str, amqp_url: str, record: Recorder
) -> None:
    nowhere = unique_name("relay-nowhere")
    events = Events()
    with durable_queue(amqp_url) as queue:
        with psycopg.connect(database_url) as conn:
            events.write_good(conn, queue, 20)
            keyed = events.bad(conn, nowhere, "unroutable", key="bad")
            parked = events.bad(conn, queue, "parked behind an unroutable event of its key", key="bad")
            keyless = events.bad(conn, nowhere, "unroutable")
            events.write_good(conn, queue, 20, keys=6)
        relay = Tapped(relay_process(database_url, amqp_url, "--max-attempts", "3"))
        try:
            wait_until(counts_are(database_url, failed=2, pending=1), timeout=60)
            dead = dead_letters(database_url)
            messages = drain_queue(amqp_url, queue, len(events.ledger.committed), timeout=30)
        finally:
            code = relay.stop()
    result = verdict(events.ledger, deliveries(messages))
    record(
        "10/bad input: unroutable RabbitMQ event",
        result,
        note="2 unroutable events dead-lettered after 3 attempts each; 1 later event of the same key parked",
    )
    assert set(dead) == {keyed, keyless}
    for entry in dead.values():
        assert entry["attempts"] == 3
        assert "unroutable" in entry["last_error"] and nowhere in entry["last_error"], entry
        assert "(after 3 attempts)" in entry["last_error"], entry
    assert dead[keyed]["blocks_key"] == "bad" and dead[keyed]["blocked_events"] == 1
    assert parked not in {m["message_id"] for m in messages}
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)
    assert result.duplicates == 0
    assert_no_crash_loop(relay, code, dead=2)


# --- 11: too large ---------------------------------------------------------------


@pytest.mark.timeout(120)
def test_11_a_payload_over_the_kafka_limit_is_dead_lettered_at_once(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic = unique_topic("oversize")
    events = Events()
    with psycopg.connect(database_url) as conn:
        events.write_good(conn, topic, 20)
        big = events.bad(conn, topic, "too large", {"blob": "x" * 5000}, key="big")
        parked = events.bad(conn, topic, "parked behind", key="big")
        big_keyless = events.bad(conn, topic, "too large", {"blob": "y" * 5000})
        events.write_good(conn, topic, 20, keys=6)
    relay, code, dead, deliveries = relay_to_kafka_until(
        database_url, f"kafka://{kafka_bootstrap}?message.max.bytes=2000", kafka_bootstrap, topic, events,
        failed=2, pending=1,
    )  # fmt: skip
    result = verdict(events.ledger, deliveries)
    record(
        "11/bad input: payload over the Kafka limit (message.max.bytes=2000)", result, note="2 dead-lettered at once"
    )
    assert set(dead) == {big, big_keyless}
    for entry in dead.values():
        assert entry["attempts"] == 1, "dead-lettered at once"
        assert "MSG_SIZE_TOO_LARGE" in entry["last_error"], entry
        assert "xxxx" not in entry["last_error"] and "yyyy" not in entry["last_error"]
    assert parked not in {d.idempotency_key for d in deliveries}
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)
    assert_no_crash_loop(relay, code, dead=2)


@pytest.mark.timeout(120)
def test_11_a_payload_over_the_rabbitmq_sink_limit_is_dead_lettered_at_once(
    database_url: str, amqp_url: str, record: Recorder
) -> None:
    limit = 64 * 1024
    events = Events()
    with durable_queue(amqp_url) as queue:
        with psycopg.connect(database_url) as conn:
            events.write_good(conn, queue, 20)
            big = events.bad(conn, queue, "too large", {"blob": "x" * (limit + 1)}, key="big")
            events.write_good(conn, queue, 20, keys=6)
        settings = replace(FAST, publish_timeout_seconds=3.0)
        store = PostgresStore(
            database_url, TableName.parse("outbox"), owner="t11", lease_seconds=settings.lease_seconds
        )
        sink = RabbitMQSink(AmqpSinkConfig(url=amqp_url), publish_timeout_seconds=3.0, max_message_bytes=limit)
        run_in_process(Relay(store, sink, settings), counts_are(database_url, failed=1, pending=0), timeout=60)
        dead = dead_letters(database_url)
        messages = drain_queue(amqp_url, queue, len(events.ledger.committed), timeout=30)
    result = verdict(events.ledger, deliveries(messages))
    record("11/bad input: payload over the RabbitMQ sink's max size", result, note="1 dead-lettered at once")
    assert set(dead) == {big}
    assert dead[big]["attempts"] == 1
    assert f"is larger than the broker's max message size of {limit} bytes" in dead[big]["last_error"]
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)


# --- 12: headers -----------------------------------------------------------------

BAD_HEADERS = ["[1]", '"a string"', "null", "1", '{"a": 1}', '{"a": null}', '{"a": {"b": "c"}}', '{"a": ["x"]}',
               '{"a": true}', '{"": "x"}']  # fmt: skip


def test_12_headers_that_are_not_an_object_of_strings_are_refused_at_write_time(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for headers in BAD_HEADERS:
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', %s::jsonb)", [headers])
        with pytest.raises(psycopg.errors.NotNullViolation):
            conn.execute("INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', NULL)")
        for bad in ({"a": 1}, {"a": None}, {1: "a"}, {"": "x"}, {"a": b"x"}):
            with pytest.raises(TypeError):
                producers.publish(conn, "t", {}, headers=bad)  # type: ignore[arg-type]
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)


RESERVED = [
    "CC", "BCC", "x-death", "x-received-from", "x-delivery-count", "x-first-death-queue", "x-amqp-1.0-properties",
]  # fmt: skip


@pytest.mark.timeout(120)
def test_12_broker_reserved_amqp_headers_are_dead_lettered_and_never_forwarded(
    database_url: str, amqp_url: str, record: Recorder
) -> None:
    events = Events()
    with durable_queue(amqp_url) as queue, durable_queue(amqp_url) as copies:
        # RabbitMQ matches header names exactly: cc and Bcc are the application's (no copy routed).
        fine_headers = {"cc": copies, "Bcc": copies, "X-Request-ID": "r-1", "x-match": "any", "x-delay": "5"}
        with psycopg.connect(database_url) as conn:
            events.write_good(conn, queue, 10)
            refused = {
                name: events.bad(conn, queue, "reserved", headers={name: copies, "ok": "1"}) for name in RESERVED
            }
            fine = events.good(conn, queue, "h", 1, headers=fine_headers)
            events.write_good(conn, queue, 10, keys=6)
        relay = Tapped(relay_process(database_url, amqp_url))
        try:
            wait_until(counts_are(database_url, failed=len(RESERVED), pending=0), timeout=60)
            dead = dead_letters(database_url)
            messages = drain_queue(amqp_url, queue, len(events.ledger.committed), timeout=30)
            copied = queue_depth(amqp_url, copies)
        finally:
            code = relay.stop()
    result = verdict(events.ledger, deliveries(messages))
    record(
        "12/bad input: reserved AMQP headers (CC, BCC, x-death...)",
        result,
        note=f"{len(RESERVED)} dead-lettered at once, none forwarded, no copy routed",
    )
    assert set(dead) == set(refused.values())
    for name, idem in refused.items():
        assert dead[idem]["attempts"] == 1
        assert f"header {name!r} is reserved by RabbitMQ" in dead[idem]["last_error"]
    assert copied == 0, "a CC/BCC header routed a copy"
    by_id = {m["message_id"]: m for m in messages}
    assert by_id[fine]["headers"] == {**fine_headers, "idempotency-key": fine}
    for m in messages:
        assert not set(m["headers"]) & set(RESERVED)
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)
    assert_no_crash_loop(relay, code, dead=len(RESERVED))


# --- 13: unknown or invalid Kafka topic ---------------------------------------


@pytest.mark.timeout(120)
def test_13_an_unknown_or_invalid_kafka_topic_is_dead_lettered_at_once(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic, missing, invalid = unique_topic("known"), unique_topic("missing"), "not a valid topic!"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for future in admin.create_topics([NewTopic(topic, 4)]).values():
        future.result(10)
    events = Events()
    with psycopg.connect(database_url) as conn:
        events.write_good(conn, topic, 20)
        unknown = events.bad(conn, missing, "unknown topic", key="m")
        bad_name = events.bad(conn, invalid, "invalid topic name")
        events.write_good(conn, topic, 20, keys=6)
    # Tansu creates topics on demand; a producer that does not ask for it sees them missing.
    relay, code, dead, deliveries = relay_to_kafka_until(
        database_url, f"kafka://{kafka_bootstrap}?allow.auto.create.topics=false", kafka_bootstrap, topic, events,
        failed=2, pending=0,
    )  # fmt: skip
    result = verdict(events.ledger, deliveries)
    record("13/bad input: unknown and invalid Kafka topics", result, note="2 dead-lettered at once")
    assert set(dead) == {unknown, bad_name}
    assert dead[unknown]["attempts"] == dead[bad_name]["attempts"] == 1
    assert "UNKNOWN_TOPIC" in dead[unknown]["last_error"], dead[unknown]
    # librdkafka names an invalid name either way: the broker's refusal, or (with
    # auto-creation off) a topic its metadata does not have. Both are permanent.
    assert any(code in dead[bad_name]["last_error"] for code in ("TOPIC_EXCEPTION", "UNKNOWN_TOPIC")), dead[bad_name]
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "relay-test-metadata"})
    try:
        assert consumer.list_topics(missing, timeout=10).topics[missing].error is not None, "never created"
    finally:
        consumer.close()
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)
    assert_no_crash_loop(relay, code, dead=2)


# --- 14: table names ---------------------------------------------------------------

INJECTIONS = ['outbox"; drop table t;--', "outbox; DROP TABLE t", 'public."t"', "public.outbox.extra", "out box",
              "outbox--", "", "x" * 64, "ünïcode", "1outbox"]  # fmt: skip
COMMANDS = [["migrate"], ["status", "--json"], ["dead"], ["requeue", "--all"], ["skip", "--id", "1"],
            ["run", "--sink", "kafka://127.0.0.1:9"]]  # fmt: skip


def assert_table_name_error(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("outbox-relay: error: invalid table name"), lines[0]
    assert "connect" not in lines[0] and CANARY not in done.stderr


def test_14_an_injected_table_name_is_refused_before_any_connection(database_url: str, record: Recorder) -> None:
    # Nothing listens at the database URL: had the relay connected first, the
    # error would be about the connection, not the table name.
    nobody = f"postgresql://app:{CANARY}@127.0.0.1:{free_port()}/db"
    runs: list[tuple[list[str], dict[str, str]]] = [
        ([*COMMANDS[i % len(COMMANDS)], "--table", name, "--database-url", nobody], {})
        for i, name in enumerate(INJECTIONS)
    ]
    runs += [
        ([*command, "--database-url", nobody], {"RELAY_TABLE": INJECTIONS[0]})
        for command in (["status"], ["run", "--sink", "kafka://127.0.0.1:9"])
    ]
    # Against a real database nothing is created or dropped either.
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TABLE t (x int)")
    runs += [
        ([*command, "--table", INJECTIONS[0], "--database-url", database_url], {})
        for command in (["migrate"], ["run", "--sink", "kafka://127.0.0.1:9"])
    ]

    def tables() -> list[tuple[Any, ...]]:
        with psycopg.connect(database_url) as conn:
            return conn.execute("SELECT schemaname, tablename FROM pg_tables ORDER BY 1, 2").fetchall()

    before = tables()
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda r: cli(*r[0], **r[1]), runs))
    for done in results:
        assert_table_name_error(done)
    assert tables() == before
    assert ("public", "t") in before
    record(
        "14/bad input: injected table names",
        None,
        runs=len(runs),
        note=f"{len(INJECTIONS)} names x every command, flag and env: one-line error before any connection",
    )


# --- 15: a canary password everywhere -----------------------------------------------


@contextlib.contextmanager
def rabbit_user(password: str) -> Iterator[str]:
    """A temporary RabbitMQ user with ``password`` and access to the default vhost."""
    name = unique_name("relay-canary")
    rabbitmqctl("add_user", name, password)
    try:
        rabbitmqctl("set_permissions", "-p", "/", name, ".*", ".*", ".*")
        yield name
    finally:
        rabbitmqctl("delete_user", name)


def with_password(url: str, user: str, password: str) -> str:
    """``url`` (amqp://...) with ``user:password`` as its credentials."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{user}:{quote(password, safe='')}@{rest.rpartition('@')[2]}"


def pg_url(conninfo: str, password: str) -> str:
    """A postgresql:// URL for the database of ``conninfo``, carrying ``password``."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    host, port, user, db = (params.get(k) for k in ("host", "port", "user", "dbname"))
    return f"postgresql://{user}:{quote(password, safe='')}@{host}:{port or 5432}/{db}"


#: Every level once per case, DEBUG (which shows everything the others show) in both formats.
LEVELS = [("DEBUG", "text"), ("DEBUG", "json"), ("INFO", "json"), ("WARNING", "text"), ("ERROR", "json")]


def run_cli(args: list[str], *, serve: bool) -> tuple[int, str, str]:
    """``outbox-relay ARGS``; with ``serve``, a ``run`` that is stopped once /healthz answers.

    Output goes to files, so a chatty DEBUG run never blocks on a full pipe.
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_") and k != "DATABASE_URL"}
    port = free_port()
    extra = ["--metrics-port", str(port)] if serve else []
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "relay", *args, *extra], stdout=out, stderr=err, env=base)
        try:
            deadline = time.monotonic() + 90
            while proc.poll() is None and time.monotonic() < deadline:
                if serve and http_ok(f"http://127.0.0.1:{port}/healthz"):
                    time.sleep(1.0)  # a moment of relaying
                    proc.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.1)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.timeout(240)
def test_15_a_canary_password_never_shows_in_any_output_or_repr(
    database_url: str, kafka_bootstrap: str, amqp_url: str, record: Recorder
) -> None:
    db_url = pg_url(database_url, CANARY)  # trust auth: accepted, and carried everywhere
    db_keywords = f"{database_url} password={CANARY}"
    db_down = f"postgresql://app:{CANARY}@127.0.0.1:{free_port()}/db"
    amqp_wrong = with_password(amqp_url, "guest", CANARY)
    kafka_userinfo = f"kafka://relay:{CANARY}@{kafka_bootstrap}"
    kafka_sasl = (
        f"kafka://{kafka_bootstrap}?security.protocol=sasl_plaintext&sasl.mechanism=PLAIN"
        f"&sasl.username=relay&sasl.password={CANARY}&ssl.key.password={CANARY}"
    )
    migrate(database_url, TableName.parse("rabbit.outbox"))
    with psycopg.connect(database_url) as conn:
        for i in range(20):
            producers.publish(conn, unique_topic("canary"), {"n": i}, headers={"h": "v"})

    # repr() of every configuration object.
    for url in (kafka_userinfo, kafka_sasl, amqp_wrong):
        assert CANARY not in repr(parse_sink_url(url))
    config = RunConfig(database_url=db_url, table=TableName.parse("outbox"), sink=parse_sink_url(amqp_wrong),
                       settings=RelaySettings())  # fmt: skip
    relay = build_relay(config)
    shown = [repr(config), repr(config.sink), repr(config.settings), repr(relay.store), repr(relay.sink)]
    assert not [s for s in shown if CANARY in s], shown

    with rabbit_user(CANARY) as user, durable_queue(amqp_url) as queue:
        amqp_ok = with_password(amqp_url, user, CANARY)
        with psycopg.connect(database_url) as conn:
            for i in range(20):
                producers.publish(conn, queue, {"n": i}, table="rabbit.outbox")
        # (name, args, works, serves)
        cases: list[tuple[str, list[str], bool, bool]] = [
            ("migrate, db URL", ["migrate", "--database-url", db_url], True, False),
            ("status, keyword DSN", ["status", "--json", "--database-url", db_keywords], True, False),
            ("migrate, db down", ["migrate", "--database-url", db_down], False, False),
            ("status, db down", ["status", "--database-url", db_down], False, False),
        ]
        runs = [
            ("run kafka, password in userinfo", db_url, kafka_userinfo, "outbox", True),
            ("run kafka, sasl.password option, broker refuses SASL", db_keywords, kafka_sasl, "outbox", False),
            ("run amqp, wrong password", db_url, amqp_wrong, "rabbit.outbox", False),
            ("run amqp, canary user", db_keywords, amqp_ok, "rabbit.outbox", True),
            ("run amqp, db down", db_down, amqp_ok, "rabbit.outbox", False),
        ]
        for name, db, sink, table, works in runs:
            cases.append((name, ["run", "--database-url", db, "--sink", sink, "--table", table], works, works))
        jobs = [(name, [*args, "--log-level", level, "--log-format", fmt], works, serves)
                for name, args, works, serves in cases for level, fmt in LEVELS]  # fmt: skip
        with ThreadPoolExecutor(8) as pool:
            outputs = list(pool.map(lambda job: (job[0], job[2], *run_cli(job[1], serve=job[3])), jobs))
        delivered = queue_depth(amqp_url, queue)

    leaks = [name for name, _works, _code, out, err in outputs if CANARY in out or CANARY in err]
    assert not leaks, leaks
    for name, works, code, _out, err in outputs:
        assert "Traceback" not in err, (name, err)
        # The cases did what they say: the working ones worked, the failing ones failed clearly.
        assert (code == 0) is works, (name, code, err)
        if not works:
            assert err.strip().splitlines()[-1].startswith("outbox-relay: error: "), (name, err)
        if name == "run amqp, wrong password":
            assert "refused the login" in err, err
    assert delivered == 20, "the relay with the canary user delivered"
    assert counts_are(database_url, pending=0)(), "the kafka relay with the canary in its URL delivered"
    record(
        "15/bad input: canary password in every URL, every command and log level",
        None,
        runs=len(jobs),
        note=f"{len(jobs)} CLI runs ({len(cases)} cases x {len(LEVELS)} level/format pairs) and repr(): no canary",
    )


# --- 16: malformed rows written by hand ---------------------------------------------

MALFORMED = {
    "null topic": "INSERT INTO outbox (topic, payload) VALUES (NULL, '{}')",
    "empty topic": "INSERT INTO outbox (topic, payload) VALUES ('', '{}')",
    "topic longer than Kafka allows": f"INSERT INTO outbox (topic, payload) VALUES ('{'t' * 250}', '{{}}')",
    "null payload": "INSERT INTO outbox (topic, payload) VALUES ('t', NULL)",
    "payload not JSON": "INSERT INTO outbox (topic, payload) VALUES ('t', 'not json')",
    "headers an array": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '[1]')",
    "headers a string": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '\"s\"')",
    "headers JSON null": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', 'null')",
    "headers SQL null": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', NULL)",
    "header value a number": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"a\": 1}')",
    "header value null": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"a\": null}')",
    "header value an object": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"a\": {}}')",
    "empty header name": "INSERT INTO outbox (topic, payload, headers) VALUES ('t', '{}', '{\"\": \"x\"}')",
    "unknown state": "INSERT INTO outbox (topic, payload, state) VALUES ('t', '{}', 'bogus')",
    "state in capitals": "INSERT INTO outbox (topic, payload, state) VALUES ('t', '{}', 'SENT')",
    "null state": "INSERT INTO outbox (topic, payload, state) VALUES ('t', '{}', NULL)",
    "empty idempotency key": "INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('t', '{}', '')",
    "idempotency key too long": (
        f"INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('t', '{{}}', '{'k' * 201}')"
    ),
    "null idempotency key": "INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('t', '{}', NULL)",
    "null deliver_at": "INSERT INTO outbox (topic, payload, deliver_at) VALUES ('t', '{}', NULL)",
    "null priority": "INSERT INTO outbox (topic, payload, priority) VALUES ('t', '{}', NULL)",
    "priority not a number": "INSERT INTO outbox (topic, payload, priority) VALUES ('t', '{}', 'high')",
}  # fmt: skip


def test_16_the_schema_refuses_malformed_rows_written_by_hand(database_url: str) -> None:
    accepted = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('t', '{}', 'taken')")
        for name, statement in MALFORMED.items():
            try:
                conn.execute(statement)
            except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
                continue
            accepted.append(name)
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO outbox (topic, payload, idempotency_key) VALUES ('t', '{}', 'taken')")
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (1,)
    assert accepted == []


ODD_BUT_VALID = ["null", "[]", '"just a string"', "false", "0", '{"nested": {"deep": [1, {"x": null}]}}', '"Zoë ✓"']


@pytest.mark.timeout(120)
def test_16_a_huge_valid_payload_inserts_and_is_dead_lettered_for_size_while_others_flow(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic = unique_topic("huge")
    events = Events()
    huge_bytes = 1_100_000  # over librdkafka's default message.max.bytes (1,000,000)
    with psycopg.connect(database_url) as conn:
        events.write_good(conn, topic, 10)
        huge = events.bad(conn, topic, "too large", {"blob": "z" * huge_bytes}, key="huge")
        odd = {}
        for i, payload in enumerate(ODD_BUT_VALID):
            idem = f"odd-{i}"
            conn.execute(
                "INSERT INTO outbox (topic, payload, idempotency_key, key) VALUES (%s, %s::jsonb, %s, '')",
                [topic, payload, idem],
            )
            odd[idem] = payload
        events.write_good(conn, topic, 10, keys=6)
        size = conn.execute("SELECT length(payload::text) FROM outbox WHERE idempotency_key = %s", [huge]).fetchone()
    assert size is not None and size[0] > huge_bytes
    relay = Tapped(relay_process(database_url, f"kafka://{kafka_bootstrap}"))
    try:
        wait_until(counts_are(database_url, failed=1, pending=0), timeout=60)
        dead = dead_letters(database_url)
        # Read raw: the odd payloads are not objects, which KafkaCollector expects.
        received = consume(kafka_bootstrap, topic, count=len(events.ledger.committed) + len(odd), timeout=30)
    finally:
        code = relay.stop()
    good: list[Delivery] = []
    odd_seen: dict[str, Any] = {}
    for message in received:
        idem = message.headers["idempotency-key"].decode()
        body = json.loads(message.value)
        if idem in odd:
            odd_seen[idem] = body
        else:
            good.append(Delivery(idem, body.get("key"), int(body.get("seq", -1))))
    result = verdict(events.ledger, good)
    record(
        "16/bad input: 1.1 MB valid JSON payload; odd but valid payloads",
        result,
        note=f"huge payload dead-lettered at once; {len(odd)} odd payloads (null, [], a string, ...) delivered",
    )
    assert set(dead) == {huge}
    assert dead[huge]["attempts"] == 1 and "MSG_SIZE_TOO_LARGE" in dead[huge]["last_error"]
    assert odd_seen == {idem: json.loads(payload) for idem, payload in odd.items()}, "delivered as they are"
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)
    assert_no_crash_loop(relay, code, dead=1)


@pytest.mark.timeout(300)
def full_test_16_a_payload_over_rabbitmqs_128_mib_is_dead_lettered_at_once(
    database_url: str, amqp_url: str, record: Recorder
) -> None:
    events = Events()
    with durable_queue(amqp_url) as queue:
        with psycopg.connect(database_url) as conn:
            events.write_good(conn, queue, 10)
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, idempotency_key)"
                " VALUES (%s, 'huge', to_jsonb(repeat('z', %s)), 'huge')",
                [queue, MAX_MESSAGE_BYTES],
            )
            events.withheld["huge"] = "too large"
            events.write_good(conn, queue, 10, keys=6)
        relay = Tapped(relay_process(database_url, amqp_url))
        try:
            wait_until(counts_are(database_url, failed=1, pending=0), timeout=240, interval=0.5)
            dead = dead_letters(database_url)
            messages = drain_queue(amqp_url, queue, len(events.ledger.committed), timeout=30)
        finally:
            code = relay.stop()
    result = verdict(events.ledger, deliveries(messages))
    record("16/bad input: payload over RabbitMQ's 128 MiB", result, note="dead-lettered at once, never sent")
    assert set(dead) == {"huge"} and dead["huge"]["attempts"] == 1
    assert "larger than the broker's max message size" in dead["huge"]["last_error"]
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)
    assert_no_crash_loop(relay, code, dead=1)


if FULL:
    # Writing and reading a 128 MiB payload takes a while: full runs only. Quick
    # runs check the same refusal against a lowered sink limit (test 11).
    test_16_a_payload_over_rabbitmqs_128_mib_is_dead_lettered_at_once = (
        full_test_16_a_payload_over_rabbitmqs_128_mib_is_dead_lettered_at_once
    )
