"""``outbox-relay`` on MySQL as a user runs it: migrate, run, and the operator's commands."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest

from devservers import free_port, wait_for_port
from relay.config import CONNECT_TIMEOUT_SECONDS
from tests import mysql_support
from tests.acceptance.cli import cli as env_cli
from tests.acceptance.cli import spawn
from tests.acceptance.test_run_kafka import http_get, metric
from tests.integration.kafka_support import consume, unique_topic
from tests.relay_support import relay_process, stop_process, wait_until

CANARY = "s3cr3t-Pa55word"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "relay", *args], capture_output=True, text=True, timeout=60)


def ok(*args: str) -> str:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def status(url: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(ok("status", "--json", "--database-url", url))
    return result


def test_migrate_twice_then_run_delivers_and_sigterm_exits_0(mysql_empty_url: str, kafka_bootstrap: str) -> None:
    url = mysql_empty_url.replace("mysql://", "mariadb://", 1)  # the same store by either name
    assert ok("migrate", "--database-url", url).strip() == "outbox: applied 1, 2, 3, 4, 5, 6, 7"
    assert ok("migrate", "--database-url", url).strip() == "outbox: up to date"
    topic = unique_topic()
    rows = [(topic, f"k{n % 7}", json.dumps({"n": n}), f"e{n}") for n in range(500)]
    mysql_support.insert_many(url, mysql_support.INSERT_EVENT, rows)
    assert status(url)["pending"] == 500
    proc = relay_process(url, f"kafka://{kafka_bootstrap}")
    try:
        wait_until(lambda: not mysql_support.outbox_counts(url), timeout=60)
    finally:
        code = stop_process(proc, signal.SIGTERM)
    assert code == 0
    received = consume(kafka_bootstrap, topic, count=500, settle_seconds=0.5)
    assert sorted(m.headers["idempotency-key"] for m in received) == sorted(f"e{n}".encode() for n in range(500))
    assert status(url) | {"oldest_pending_age_seconds": 0} == {
        "pending": 0,
        "in_flight": 0,
        "failed": 0,
        "oldest_pending_age_seconds": 0,
        "parked_keys": 0,
        "scheduled": 0,
        "keys_waiting_on_schedule": 0,
        "retrying": 0,
        "oldest_retrying_age_seconds": 0,
        "retrying_topics": [],
        "topics": [],
        "topic_count": 0,
    }


def test_the_operators_commands_work_on_mysql(mysql_url: str) -> None:
    mysql_support.execute(
        mysql_url,
        "INSERT INTO outbox (topic, `key`, payload, idempotency_key, state, attempts, last_error, failed_at)"
        " VALUES ('t', 'k', '{}', 'dead-1', 'failed', 3, 'too large', UTC_TIMESTAMP(6)),"
        " ('t', 'k', '{}', 'behind', 'pending', 0, NULL, NULL)",
    )
    dead = json.loads(ok("dead", "--json", "--database-url", mysql_url))
    assert [(d["idempotency_key"], d["blocks_key"], d["blocked_events"]) for d in dead] == [("dead-1", "k", 1)]
    shown = json.loads(ok("inspect", str(dead[0]["id"]), "--json", "--database-url", mysql_url))
    assert (shown["state"], shown["last_error"]) == ("failed", "too large")
    assert json.loads(ok("requeue", "--key", "k", "--json", "--database-url", mysql_url)) == {
        "requeued": [dead[0]["id"]]
    }
    assert ok("skip", "--id", str(dead[0]["id"]), "--database-url", mysql_url).startswith("skipped")
    assert json.loads(ok("purge", "--older-than", "0s", "--json", "--database-url", mysql_url)) == {"purged": 1}
    assert status(mysql_url)["pending"] == 1


@pytest.mark.parametrize("command", [["migrate"], ["status"]])
def test_a_wrong_password_or_a_dead_server_never_shows_the_password(command: list[str], mysql_url: str) -> None:
    database = mysql_url.rsplit("/", 1)[1]
    for url in (
        f"mysql://nobody:{CANARY}@127.0.0.1:3306/{database}",
        f"mysql://app:{CANARY}@127.0.0.1:{free_port()}/{database}",
    ):
        done = cli(*command, "--database-url", url)
        assert done.returncode != 0
        assert CANARY not in done.stdout + done.stderr
        assert "error" in done.stderr


#: Passwords a user may have, percent-encoded in the URL as RFC 3986 asks.
ODD_PASSWORDS = ["pä$$wörd€", "a/b@c:d#e?f%g", "\u5bc6\u7801 with spaces"]


@pytest.mark.parametrize("password", ODD_PASSWORDS)
def test_a_password_with_non_ascii_or_url_delimiters_works_and_never_shows(password: str, mysql_url: str) -> None:
    database = mysql_url.rsplit("/", 1)[1]
    user = f"odd_{database[-12:]}"
    mysql_support.execute(mysql_url, f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", [password])
    try:
        mysql_support.execute(mysql_url, f"GRANT ALL ON `{database}`.* TO '{user}'@'%'")
        url = f"mysql://{user}:{quote(password, safe='')}@127.0.0.1:3306/{database}"
        assert ok("migrate", "--database-url", url).strip() == "outbox: up to date"
        assert status(url)["pending"] == 0
        wrong = cli("status", "--database-url", url.replace(quote(password, safe=""), quote(password[::-1], safe="")))
        assert wrong.returncode != 0 and "Traceback" not in wrong.stderr, wrong.stderr
        for text in (wrong.stdout + wrong.stderr, unquote(wrong.stderr)):
            assert password not in text and password[::-1] not in text, text
    finally:
        mysql_support.execute(mysql_url, f"DROP USER IF EXISTS '{user}'@'%'")


def test_an_unknown_scheme_still_names_both_databases() -> None:
    done = cli("status", "--database-url", f"mongodb://app:{CANARY}@db/x")
    assert done.returncode == 2
    assert "postgresql:// or mysql://" in done.stderr and CANARY not in done.stderr


@pytest.mark.timeout(120)
def test_metrics_health_and_keep_sent_on_mysql(mysql_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic()
    rows = [(topic, f"k{n % 3}", json.dumps({"n": n})) for n in range(100)]
    mysql_support.insert_many(mysql_url, "INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", rows)
    port = free_port()
    proc = relay_process(mysql_url, f"kafka://{kafka_bootstrap}", "--metrics-port", str(port), "--keep-sent")
    try:
        wait_for_port("127.0.0.1", port)
        wait_until(lambda: mysql_support.outbox_counts(mysql_url) == {"sent": 100}, timeout=60)
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        status_code, text = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status_code == 200
        assert metric(text, f'outbox_relay_published_total{{topic="{topic}"}}') == 100
        assert "outbox_relay_pending" in text
    finally:
        assert stop_process(proc) == 0
    replayed = json.loads(ok("replay", "--key", "k1", "--json", "--database-url", mysql_url))["replayed"]
    assert len(replayed) == 33  # n % 3 == 1 for n below 100


@pytest.mark.parametrize(
    "bounds",
    [
        ("--until", "9999-12-31T23:00:00-05:00"),  # past year 9999 in UTC
        ("--since", "0001-01-01T00:30:00+01:00"),  # before year 1 in UTC
        ("--since", "0001-01-01T00:30:00+01:00", "--until", "9999-12-31T23:00:00-05:00"),
    ],
)
def test_replay_takes_times_at_the_ends_of_the_calendar(mysql_url: str, bounds: tuple[str, ...]) -> None:
    # As on PostgreSQL: a bound beyond what a datetime holds in UTC is as far as it goes, not a traceback.
    conn = mysql_support.connect(mysql_url)
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO outbox (topic, payload, state, published_at) VALUES ('t', '{}', 'sent', UTC_TIMESTAMP(6))"
        )
    conn.close()
    replayed = json.loads(ok("replay", *bounds, "--json", "--database-url", mysql_url))["replayed"]
    assert len(replayed) == 1


def test_notify_off_is_what_mysql_has_and_on_is_refused(mysql_empty_url: str) -> None:
    """An environment shared with PostgreSQL may turn NOTIFY off; MySQL has no NOTIFY to turn on."""
    assert "applied" in ok("migrate", "--database-url", mysql_empty_url, "--no-notify")
    assert "up to date" in env_cli("migrate", "--database-url", mysql_empty_url, RELAY_NOTIFY="0").stdout
    refused = cli("migrate", "--database-url", mysql_empty_url, "--notify")
    assert refused.returncode == 2 and "--notify is for PostgreSQL" in refused.stderr


# Each command and the server's refusal it meets: the admin commands read through asyncmy, migrate
# (and --create-roles) through PyMySQL, whose errors printed as the driver's tuple.
SERVER_REFUSALS = [
    (["status", "--database-url", "{base}/no_such_database_here"], "MySQL error 1049: Unknown database"),
    (["status", "--database-url", "{url}", "--table", "information_schema.outbox"], "does not exist"),
    (["dead", "--database-url", "{url}"], "does not exist: run `outbox-relay migrate` first"),
    (["migrate", "--database-url", "{base}/no_such_database_here"], "MySQL error 1049: Unknown database"),
    (["migrate", "--database-url", "{wrong_password}"], ": Access denied for user"),
    (["migrate", "--database-url", "{dead_server}"], "MySQL error 2003: Can't connect"),
    (["migrate", "--database-url", "{url}", "--table", "information_schema.outbox"], "MySQL error 1044: Access denied"),
    (["migrate", "--database-url", "{url}", "--table", "performance_schema.outbox"], "MySQL error 1142: CREATE"),
    # MariaDB's account names are utf8mb3: no 4-byte character. The relay role is made first, so
    # that nothing is left on the server; the table's migration logs at INFO before it.
    (
        [
            "migrate",
            "--database-url",
            "{url}",
            "--log-level",
            "WARNING",
            "--create-roles",
            "--relay-role",
            "r\U0001f600",
        ],
        "MySQL error 1300",
    ),
]


@pytest.mark.parametrize(
    ("args", "needle"), SERVER_REFUSALS, ids=lambda v: " ".join(v[:1] + v[3:]) if isinstance(v, list) else None
)
def test_server_errors_read_as_sentences_not_driver_tuples(mysql_empty_url: str, args: list[str], needle: str) -> None:
    base, database = mysql_empty_url.rsplit("/", 1)
    host = urlsplit(mysql_empty_url).hostname
    urls = {
        "base": base,
        "url": mysql_empty_url,
        "wrong_password": f"mysql://nobody:{CANARY}@{host}:{urlsplit(mysql_empty_url).port or 3306}/{database}",
        "dead_server": f"mysql://app:{CANARY}@{host}:{free_port()}/{database}",
    }
    result = cli(*(a.format(**urls) for a in args))
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0 and len(errors) == 1 and needle in errors[0], result.stderr
    assert re.search(r"\(\d{4}, ", result.stderr) is None, result.stderr  # not the driver's (1049, "...")
    assert CANARY not in result.stderr


def test_status_counts_a_row_with_a_zero_created_at(mysql_url: str) -> None:
    """MariaDB takes '0000-00-00' from a writer whose sql_mode lacks NO_ZERO_DATE; TIMESTAMPDIFF gives NULL for it."""
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = ''")
            cur.execute(
                "INSERT INTO outbox (topic, `key`, payload, created_at) VALUES"
                " ('t', 'k', '{}', '0000-00-00 00:00:00'), ('t', 'k2', '{}', UTC_TIMESTAMP(6))"
            )
    finally:
        conn.close()
    shown = cli("status", "--json", "--database-url", mysql_url)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    status = json.loads(shown.stdout)
    assert status["pending"] == 2 and 0 <= status["oldest_pending_age_seconds"] < 60, status


def test_a_created_at_ahead_of_the_clock_does_not_hide_the_age_of_the_events_after_it(mysql_url: str) -> None:
    mysql_support.execute(
        mysql_url,
        "INSERT INTO outbox (topic, `key`, payload, created_at) VALUES"
        " ('t', 'a', '{}', UTC_TIMESTAMP(6) + INTERVAL 2 HOUR), ('t', 'b', '{}', UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)",
    )
    shown = cli("status", "--json", "--database-url", mysql_url)
    assert shown.returncode == 0, shown.stderr
    assert 3500 < json.loads(shown.stdout)["oldest_pending_age_seconds"] < 3700, shown.stdout


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A port whose server takes connections and never says a word: a frozen server, or another
    protocol's that waits for the client to speak first (``mysql://`` at PostgreSQL's port)."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:  # the kernel accepts; no one answers
        yield server.getsockname()[1]


#: Every command that connects to the database, started at once against the silent server.
CONNECTING_COMMANDS = [
    ["migrate"],
    ["status"],
    ["dead"],
    ["requeue", "--all"],
    ["skip", "--id", "1"],
    ["inspect", "1"],
    ["purge", "--older-than", "1d"],
    ["replay", "--all"],
    ["run", "--sink", "kafka://127.0.0.1:1"],
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scheme", ["mysql", "mariadb", "postgresql"])
def test_a_server_that_never_answers_ends_every_command_at_the_connect_timeout(scheme: str) -> None:
    # MySQL's drivers bounded only the TCP connect: migrate waited for the server's greeting for
    # ever, the other commands for the 35 s call deadline; PostgreSQL gives up at the connect timeout.
    with silent_server() as port:
        url = f"{scheme}://app:{CANARY}@127.0.0.1:{port}/shop"
        started = time.monotonic()
        procs = [spawn(*command, "--database-url", url) for command in CONNECTING_COMMANDS]
        try:
            outputs = [proc.communicate(timeout=CONNECT_TIMEOUT_SECONDS + 20) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        took = time.monotonic() - started
    assert took < CONNECT_TIMEOUT_SECONDS + 15, f"took {took:.0f} s"
    for command, proc, (out, err) in zip(CONNECTING_COMMANDS, procs, outputs, strict=True):
        assert proc.returncode == 1, (command, out, err)
        assert err.startswith("outbox-relay: error: ") and err.count("\n") == 1, (command, err)
        assert CANARY not in out + err


@pytest.mark.parametrize("token", ["not-a-uuid", "7", "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz", "{0}"])
def test_inspect_shows_a_claim_token_that_is_no_uuid_as_it_is(mysql_url: str, token: str) -> None:
    # The column is text on MySQL (a uuid on PostgreSQL): plain SQL may write anything there.
    mysql_support.execute(
        mysql_url,
        "INSERT INTO outbox (id, topic, payload, idempotency_key, claim_token) VALUES (7, 't', '{}', 'odd', %s)",
        [token],
    )
    shown = json.loads(ok("inspect", "7", "--json", "--database-url", mysql_url))
    assert (shown["idempotency_key"], shown["claim_token"]) == ("odd", token)
    assert f"claim_token: {token}\n" in ok("inspect", "7", "--database-url", mysql_url)


#: Keys that are not UTF-8 (any bytes fit a VARBINARY), the first the one reported.
NOT_UTF8_KEYS = [b"\xe9\xff", "caf\u00e9".encode("latin-1"), b"\xe2\x82", b"ok\xc0\xaf"]


def test_a_key_that_is_not_utf8_and_the_text_of_its_escape_are_shown_and_selected_apart(mysql_url: str) -> None:
    """The bytes E9 FF and the 8-character text key \\xe9\\xff were shown the same way by dead, dead
    --json and inspect, and requeue --key with the key copied from that output requeued the other."""
    escaped = [raw.decode("utf-8", "backslashreplace") for raw in NOT_UTF8_KEYS]  # how dead showed the bytes
    rows = [(raw, f"bytes-{n}") for n, raw in enumerate(NOT_UTF8_KEYS)]
    rows += [(text.encode(), f"text-{n}") for n, text in enumerate(escaped)]
    mysql_support.insert_many(
        mysql_url,
        "INSERT INTO outbox (topic, `key`, payload, idempotency_key, state, last_error, failed_at)"
        " VALUES ('t', %s, '{}', %s, 'failed', 'x', UTC_TIMESTAMP(6))",
        rows,
    )
    by_idem = {d["idempotency_key"]: d for d in json.loads(ok("dead", "--json", "--database-url", mysql_url))}
    lines = ok("dead", "--database-url", mysql_url).splitlines()
    shown = {int(line.split("\t")[0]): line.split("\t")[2] for line in lines}
    for n, raw in enumerate(NOT_UTF8_KEYS):
        as_bytes, as_text = by_idem[f"bytes-{n}"], by_idem[f"text-{n}"]
        assert (as_bytes["key"], as_bytes["key_hex"]) == (None, raw.hex())
        assert (as_text["key"], as_text["key_hex"]) == (escaped[n], escaped[n].encode().hex())
        assert shown[as_bytes["id"]] == f"key_hex={raw.hex()}" and shown[as_text["id"]] == f"key={escaped[n]}"
    bytes_id, text_id = by_idem["bytes-0"]["id"], by_idem["text-0"]["id"]
    assert "\nkey_hex: e9ff\n" in ok("inspect", str(bytes_id), "--database-url", mysql_url)
    inspected = json.loads(ok("inspect", str(bytes_id), "--json", "--database-url", mysql_url))
    assert (inspected["key"], inspected["key_hex"]) == (None, "e9ff")
    # What each output shows, copied back, selects that event and no other.
    text_key = shown[text_id].split("=", 1)[1]
    assert json.loads(ok("requeue", "--key", text_key, "--json", "--database-url", mysql_url)) == {
        "requeued": [text_id]
    }
    requeued = json.loads(ok("requeue", "--key-hex", "e9ff", "--json", "--database-url", mysql_url))
    assert requeued == {"requeued": [bytes_id]}
