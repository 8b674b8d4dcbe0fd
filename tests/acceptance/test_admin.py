"""Admin commands as a user runs them: inspect, purge, replay, retention and least-privilege roles."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from datetime import datetime

import psycopg
import pytest

import producers
from tests.acceptance.cli import cli, spawn
from tests.integration.rabbit_support import temp_queue
from tests.relay_support import RelayThread, outbox_counts, wait_until


def test_inspect_shows_one_event(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "t", {"a": 1}, key="k", idempotency_key="i-1")
        row = conn.execute("SELECT id FROM outbox").fetchone()
    assert row is not None
    shown = json.loads(cli("inspect", str(row[0]), "--json", "--database-url", database_url).stdout)
    assert (shown["topic"], shown["key"], shown["idempotency_key"], shown["state"]) == ("t", "k", "i-1", "pending")
    assert json.loads(shown["payload"]) == {"a": 1}
    missing = cli("inspect", "999999", "--database-url", database_url)
    assert missing.returncode == 1 and "no event 999999" in missing.stderr


def test_inspect_writes_json_headers_iso_times_and_one_line_a_column(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "t", {"a": True}, headers={"h": "v\u00e9"}, idempotency_key="i-2")
        row = conn.execute(
            "UPDATE outbox SET last_error = 'line one' || chr(10) || 'line two', failed_at = now() RETURNING id"
        ).fetchone()
    assert row is not None
    shown = json.loads(cli("inspect", str(row[0]), "--json", "--database-url", database_url).stdout)
    for column in ("created_at", "deliver_at", "failed_at"):
        assert "T" in shown[column] and datetime.fromisoformat(shown[column]).tzinfo is not None, shown[column]
    assert shown["headers"] == {"h": "v\u00e9"} and shown["last_error"] == "line one\nline two"
    text = cli("inspect", str(row[0]), "--database-url", database_url).stdout
    lines = dict(line.split(": ", 1) for line in text.splitlines())
    assert json.loads(lines["headers"]) == {"h": "v\u00e9"}
    assert lines["last_error"] == "line one\\nline two"
    assert json.loads(lines["payload"]) == {"a": True}


def test_dead_says_when_its_limit_cut_the_list(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, payload, state, last_error, attempts, failed_at)"
            " SELECT 't', '{}', 'failed', 'boom ' || g, 3, now() FROM generate_series(1, 3) g"
        )
    cut = cli("dead", "--json", "--limit", "2", "--database-url", database_url)
    assert [e["last_error"] for e in json.loads(cut.stdout)] == ["boom 1", "boom 2"]
    assert "there are more (--limit)" in cut.stderr
    whole = cli("dead", "--json", "--database-url", database_url)
    assert len(json.loads(whole.stdout)) == 3 and "--limit" not in whole.stderr
    exact = cli("dead", "--json", "--limit", "3", "--database-url", database_url)
    assert len(json.loads(exact.stdout)) == 3 and "--limit" not in exact.stderr


def test_keep_sent_then_replay_and_purge_never_touches_unsent(database_url: str, amqp_url: str) -> None:
    with temp_queue(amqp_url) as q:
        with psycopg.connect(database_url) as conn:
            for i in range(5):
                producers.publish(conn, q.name, {"i": i}, key="k" if i < 2 else None, idempotency_key=f"s{i}")
        with RelayThread(database_url, amqp_url, keep_sent=True):
            wait_until(lambda: outbox_counts(database_url) == {"sent": 5}, timeout=30)
        assert sorted(m.message_id or "" for m in q.collect(5)) == [f"s{i}" for i in range(5)]

        with psycopg.connect(database_url) as conn:
            producers.publish(conn, q.name, {}, idempotency_key="unsent")
            conn.execute("INSERT INTO outbox (topic, payload, state, last_error) VALUES ('t', '{}', 'failed', 'x')")
            conn.execute("UPDATE outbox SET published_at = now() - interval '2 hours' WHERE state = 'sent'")

        replayed = json.loads(cli("replay", "--key", "k", "--json", "--database-url", database_url).stdout)
        assert len(replayed["replayed"]) == 2
        assert cli("replay", "--database-url", database_url).returncode == 2

        purged = json.loads(cli("purge", "--older-than", "1h", "--json", "--database-url", database_url).stdout)
        assert purged == {"purged": 3}
        assert outbox_counts(database_url) == {"pending": 3, "failed": 1}
        bad = cli("purge", "--older-than", "soon", "--database-url", database_url)
        assert bad.returncode == 2 and "invalid duration" in bad.stderr


@pytest.fixture
def login_roles(pg_admin_url: str, database_url: str) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    relay_role, writer_role = f"relay_{suffix}", f"writer_{suffix}"
    result = cli("migrate", "--create-roles", "--relay-role", relay_role, "--writer-role", writer_role,
                 "--database-url", database_url)  # fmt: skip
    assert result.returncode == 0, result.stderr
    users = {"relay": f"relay_user_{suffix}", "writer": f"writer_user_{suffix}"}
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{users["relay"]}" LOGIN IN ROLE "{relay_role}"')
        conn.execute(f'CREATE ROLE "{users["writer"]}" LOGIN IN ROLE "{writer_role}"')
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    urls = {name: psycopg.conninfo.make_conninfo(**{**{k: str(v) for k, v in info.items()}, "user": user})
            for name, user in users.items()}  # fmt: skip
    yield urls
    with psycopg.connect(database_url, autocommit=True) as conn:
        for role in (*users.values(), relay_role, writer_role):
            conn.execute(f'DROP OWNED BY "{role}"')
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for role in (*users.values(), relay_role, writer_role):
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_the_relay_runs_with_only_the_relay_role_and_writers_can_only_insert(
    login_roles: dict[str, str], amqp_url: str
) -> None:
    with psycopg.connect(login_roles["writer"]) as conn:
        producers.publish(conn, "ignored", {}, idempotency_key="w-1")
        assert producers.publish(conn, "ignored", {}, idempotency_key="w-1") == "w-1"
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM outbox")
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT payload FROM outbox")
    with temp_queue(amqp_url) as q:
        with psycopg.connect(login_roles["writer"]) as conn:
            producers.publish(conn, q.name, {"n": 1}, idempotency_key="w-2")
        with RelayThread(login_roles["relay"], amqp_url):
            wait_until(lambda: q.count() == 1, timeout=30)
    status = cli("status", "--json", "--database-url", login_roles["relay"])
    assert status.returncode == 0, status.stderr
    with psycopg.connect(login_roles["relay"]) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")


def test_skip_refuses_an_event_that_may_be_in_flight_and_says_why(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "t", {}, key="k", idempotency_key="leased")
        producers.publish(conn, "t", {}, key="k", idempotency_key="next")
        # As a relay leaves it: leased, its lease ended 20 s ago.
        conn.execute(
            "UPDATE outbox SET attempts = 1, claim_token = gen_random_uuid(), lease_owner = 'relay-1',"
            " lease_expires_at = now() - interval '20 seconds' WHERE idempotency_key = 'leased'"
        )
        row = conn.execute("SELECT id FROM outbox WHERE idempotency_key = 'leased'").fetchone()
    assert row is not None
    refused = cli("skip", "--id", str(row[0]), "--database-url", database_url)
    assert refused.returncode == 1, refused
    assert "may be in flight" in refused.stderr and "40s" in refused.stderr  # 30 s publish timeout + 10 s
    assert outbox_counts(database_url) == {"pending": 2}
    # The relays publish within 5 s: a lease over for 20 s is past 5 + 10 s.
    done = cli("skip", "--id", str(row[0]), "--database-url", database_url, RELAY_PUBLISH_TIMEOUT="5")
    assert done.returncode == 0, done.stderr
    assert outbox_counts(database_url) == {"pending": 1, "skipped": 1}


def test_status_shows_what_waits_on_a_schedule(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        # Plain SQL may write what publish() refuses: a key parked until the year 9999.
        # (Written before the table bounded deliver_at, migration 0005: inserted, then moved.)
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')")
        conn.execute("UPDATE outbox SET deliver_at = '9999-12-31'")
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')")
        conn.execute("INSERT INTO outbox (topic, payload, deliver_at) VALUES ('t', '{}', now() + interval '1 day')")
    shown = json.loads(cli("status", "--json", "--database-url", database_url).stdout)
    assert (shown["pending"], shown["failed"], shown["parked_keys"]) == (3, 0, 0)
    assert (shown["scheduled"], shown["keys_waiting_on_schedule"]) == (2, 1)
    text = cli("status", "--database-url", database_url).stdout
    assert "scheduled: 2\n" in text and "keys waiting on schedule: 1\n" in text


@pytest.mark.parametrize("how", ["flags", "relay flag and default writer", "env"])
def test_one_role_for_the_relay_and_the_writers_is_refused_before_any_change(database_url: str, how: str) -> None:
    role = f"one_{uuid.uuid4().hex[:8]}"
    command = ["migrate", "--create-roles", "--database-url", database_url]
    if how == "env":
        result = cli(*command, RELAY_RELAY_ROLE=role, RELAY_WRITER_ROLE=role)
    elif how == "flags":
        result = cli(*command, "--relay-role", role, "--writer-role", role)
    else:
        result = cli(*command, "--relay-role", "outbox_writer")
    assert result.returncode == 2, result.stderr
    assert "--relay-role and --writer-role must differ" in result.stderr
    assert "Traceback" not in result.stderr
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", [role]).fetchone() == (0,)


def test_an_empty_key_selects_and_an_empty_topic_is_refused(database_url: str) -> None:
    # publish() takes "" as a key, so requeue and replay select by it; no event has an empty topic.
    with psycopg.connect(database_url) as conn:
        for key in ("", "k", None):
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, state, published_at) VALUES ('t', %s, '{}', 'sent', now())",
                (key,),
            )
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
                " VALUES ('t', %s, '{}', 'failed', 'boom', now())",
                (key,),
            )
    replayed = cli("replay", "--key", "", "--json", "--database-url", database_url)
    requeued = cli("requeue", "--key", "", "--json", "--database-url", database_url)
    assert replayed.returncode == 0 and requeued.returncode == 0, replayed.stderr + requeued.stderr
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT key, state, count(*) FROM outbox GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert len(json.loads(replayed.stdout)["replayed"]) == 1 and len(json.loads(requeued.stdout)["requeued"]) == 1
    assert rows == [("", "pending", 2), ("k", "failed", 1), ("k", "sent", 1), (None, "failed", 1), (None, "sent", 1)]
    for command in ("replay", "requeue"):
        refused = cli(command, "--topic", "", "--database-url", database_url)
        assert refused.returncode == 2 and "no event has an empty topic" in refused.stderr, refused.stderr


@pytest.mark.parametrize("command", ["requeue", "replay"])
@pytest.mark.parametrize("flag", ["--key", "--topic"])
@pytest.mark.parametrize("value", ["\udcff", "ab\udce9c", "\udcc3"])  # bytes that are not UTF-8, as a shell passes them
def test_a_filter_of_bytes_that_are_not_utf8_matches_nothing(
    database_url: str, command: str, flag: str, value: str
) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
            " VALUES ('t', 'k', '{}', 'failed', 'x', now())"
        )
    done = cli(command, flag, value, "--json", "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) in ({"requeued": []}, {"replayed": []})


@pytest.mark.parametrize(
    "args",
    [
        ("requeue", "--id", "1", "--id", "2"),
        ("requeue", "--key", "a", "--key", "b"),
        ("requeue", "--topic", "a", "--topic", "a"),
        ("replay", "--key", "a", "--key", "b"),
        ("replay", "--since", "2026-01-01", "--since", "2026-02-01"),
        ("replay", "--until", "2026-01-01", "--until", "2026-02-01"),
        ("replay", "--topic", "a", "--topic", "b"),
        ("skip", "--id", "3", "--id", "10"),
    ],
)
def test_a_selection_flag_given_twice_is_refused(database_url: str, args: tuple[str, ...]) -> None:
    # Only the last value was used: an operator meaning both got one, without a word.
    done = cli(*args, "--database-url", database_url)
    assert done.returncode == 2 and "is given twice" in done.stderr, done.stderr


@pytest.mark.parametrize("role", ["", "a`b", "x" * 64, "é" * 32, "line\nbreak", "tab\there", "ctl\x01"])
@pytest.mark.parametrize("flag", ["--relay-role", "--writer-role"])
def test_role_names_no_database_takes_as_they_are_are_refused(database_url: str, flag: str, role: str) -> None:
    # Refused before anything runs, with the reason: MySQL took none of them, PostgreSQL cut long ones.
    done = cli("migrate", "--create-roles", flag, role, "--database-url", database_url)
    assert done.returncode == 2, done.stderr
    assert flag in done.stderr and "Traceback" not in done.stderr
    by_variable = cli("migrate", "--create-roles", "--database-url", database_url, RELAY_WRITER_ROLE=role)
    assert by_variable.returncode == 2 and "RELAY_WRITER_ROLE" in by_variable.stderr, by_variable.stderr


def test_dead_lists_one_line_per_event_whatever_its_error_holds(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
            " VALUES ('t\tx', 'k\ny', '{}', 'failed', E'first line\n42\tlooks like an id\r', now())"
        )
    done = cli("dead", "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    # The key with a newline in hex (the text k\ny, escaped, would read as the key of four characters k, \, n, y).
    assert line.split("\t")[1:3] == ["t\\tx", "key_hex=6b0a79"]
    assert line.endswith("first line\\n42\\tlooks like an id\\r")


def test_dead_tells_an_event_without_a_key_from_one_whose_key_reads_none(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        for key in (None, "None", "", "no key"):
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
                " VALUES ('t', %s, '{}', 'failed', 'boom', now())",
                [key],
            )
    done = cli("dead", "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    assert [line.split("\t")[2] for line in done.stdout.splitlines()] == ["no key", "key=None", "key=", "key=no key"]


def test_dead_says_when_an_event_has_no_error_recorded(database_url: str) -> None:
    """A row dead-lettered by hand (plain SQL) may have no last_error: the line says so, not "None"."""
    with psycopg.connect(database_url) as conn:
        for error in (None, "None", ""):
            conn.execute(
                "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
                " VALUES ('t', 'k', '{}', 'failed', %s, now())",
                [error],
            )
    done = cli("dead", "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    assert [line.split("\t")[-1] for line in done.stdout.splitlines()] == ["(no error recorded)", "None", ""]
    listed = cli("dead", "--json", "--database-url", database_url)
    assert [e["last_error"] for e in json.loads(listed.stdout)] == [None, "None", ""]


def test_retention_without_keep_sent_purges_old_skipped_events(database_url: str, amqp_url: str) -> None:
    """Skipped events stay in the table whatever --keep-sent says: --retention ages them out."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, payload, state, idempotency_key, created_at, failed_at) VALUES"
            " ('t', '{}', 'skipped', 'old-skipped', now() - interval '3 hours', now() - interval '2 hours'),"
            " ('t', '{}', 'skipped', 'new-skipped', now(), now()),"
            " ('t', '{}', 'failed', 'old-dead', now() - interval '3 hours', now() - interval '2 hours')"
        )
    relay = spawn("run", "--database-url", database_url, "--sink", amqp_url, "--retention", "1h")
    try:

        def left() -> list[str]:
            with psycopg.connect(database_url) as conn:
                return [r[0] for r in conn.execute("SELECT idempotency_key FROM outbox ORDER BY idempotency_key")]

        wait_until(lambda: left() == ["new-skipped", "old-dead"], timeout=30)
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.communicate(timeout=30)
    assert relay.returncode == 0


def test_events_with_ids_of_zero_and_below_can_be_inspected_skipped_and_requeued(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (id, topic, key, payload, state, last_error, failed_at) OVERRIDING SYSTEM VALUE"
            " VALUES (-5, 't', 'k', '{}', 'failed', 'boom', now()), (0, 't', 'j', '{}', 'failed', 'boom', now()),"
            " (-9223372036854775808, 't', 'i', '{}', 'failed', 'boom', now())"
        )
    listed = cli("dead", "--database-url", database_url)
    assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["-9223372036854775808", "-5", "0"]
    inspected = cli("inspect", "-5", "--database-url", database_url)
    assert inspected.returncode == 0 and "id: -5" in inspected.stdout, inspected.stderr
    skipped = cli("skip", "--id", "-5", "--database-url", database_url)
    assert skipped.returncode == 0 and "skipped event -5" in skipped.stdout, skipped.stderr
    requeued = cli("requeue", "--id", "0", "--database-url", database_url)
    assert requeued.returncode == 0 and "requeued 1 events" in requeued.stdout, requeued.stderr
    lowest = cli("requeue", "--id=-9223372036854775808", "--database-url", database_url)
    assert lowest.returncode == 0 and "requeued 1 events" in lowest.stdout, lowest.stderr
    with psycopg.connect(database_url) as conn:
        states = conn.execute("SELECT id, state FROM outbox ORDER BY id").fetchall()
    assert states == [(-9223372036854775808, "pending"), (-5, "skipped"), (0, "pending")]


def test_a_reader_that_stops_early_ends_the_command_quietly(database_url: str) -> None:
    # `outbox-relay dead | head -1`: the rest of the output meets a closed pipe.
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, state, last_error, failed_at)"
            " SELECT 't', 'k' || g, '{}', 'failed', repeat('e', 200), now() FROM generate_series(1, 3000) AS g"
        )
    for command in (["dead"], ["dead", "--json"], ["inspect", "1"]):
        with spawn(*command, "--database-url", database_url, "--log-level", "warning") as relay:
            assert relay.stdout is not None and relay.stderr is not None
            relay.stdout.read(10)
            relay.stdout.close()
            assert relay.wait(timeout=60) in (0, 141)  # 0: it had written everything before the close
            said = relay.stderr.read()
        assert "Traceback" not in said and "BrokenPipe" not in said, said


def test_skip_json_prints_the_skipped_id_or_none(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        (dead,) = (
            conn.execute(
                "INSERT INTO outbox (topic, payload, state, failed_at) VALUES ('t', '{}', 'failed', now()) RETURNING id"
            ).fetchone()
            or ()
        )
    for expected, code in (([dead], 0), ([], 1)):  # the second time it is skipped already
        done = cli("skip", "--id", str(dead), "--json", "--database-url", database_url)
        assert (json.loads(done.stdout), done.returncode) == ({"skipped": expected}, code), done.stderr
    assert "not dead-lettered or waiting" in done.stderr


@pytest.mark.parametrize(
    ("args", "fails"),
    [
        (["status"], False),
        (["status", "--json"], False),
        (["dead"], False),
        (["inspect", "1"], False),
        (["inspect", "999999"], True),
        (["skip", "--id", "999999"], True),
        (["requeue", "--all"], False),
        (["purge", "--older-than", "1d"], False),
        (["replay", "--all"], False),
    ],
)
def test_an_operator_command_writes_nothing_to_stderr_but_its_one_line_error(
    database_url: str, args: list[str], fails: bool
) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "t", {"n": 1}, key="k")
    done = cli(*args, "--database-url", database_url)
    assert done.returncode == (1 if fails else 0), done.stderr
    assert done.stderr.splitlines() == ([done.stderr.strip()] if fails else []), done.stderr
    if fails:
        assert done.stderr.startswith("outbox-relay: error: ")
    # Asked for, the log is there.
    logged = cli(*args, "--database-url", database_url, RELAY_LOG_LEVEL="INFO")
    assert "connected to the database" in logged.stderr


@pytest.mark.parametrize("state", ["pending", "sent", "skipped", None])  # None: no such event
@pytest.mark.parametrize("as_json", [False, True])
def test_requeue_of_one_event_that_is_not_dead_lettered_fails_and_changes_nothing(
    database_url: str, state: str | None, as_json: bool
) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (id, topic, key, payload, state, attempts) OVERRIDING SYSTEM VALUE"
            " VALUES (7, 't', 'k', '{}', 'failed', 3)"
        )
        if state is not None:
            conn.execute(
                "INSERT INTO outbox (id, topic, key, payload, state, attempts) OVERRIDING SYSTEM VALUE"
                " VALUES (8, 't', 'k', '{}', %s, 2)",
                [state],
            )
        before = conn.execute("SELECT * FROM outbox ORDER BY id").fetchall()
    done = cli("requeue", "--id", "8", *(["--json"] if as_json else []), "--database-url", database_url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "event 8 is not dead-lettered (or does not exist)" in done.stderr
    assert (json.loads(done.stdout) == {"requeued": []}) if as_json else (done.stdout == "")  # no "requeued 0"
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT * FROM outbox ORDER BY id").fetchall() == before
    # The dead letter beside it is still requeued by its id, as before.
    requeued = cli("requeue", "--id", "7", "--database-url", database_url)
    assert requeued.returncode == 0 and "requeued 1 events" in requeued.stdout, requeued.stderr


def test_status_shows_retrying_events_and_each_topic_s_lag_and_retry_takes_them_by_id_or_topic(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        # What a relay leaves after failed attempts: pending, attempts counted, the error, a backoff ahead.
        failing = (
            "INSERT INTO outbox (topic, key, payload, attempts, last_error, deliver_at, created_at)"
            " VALUES (%s, %s, '{}', %s, %s, now() + interval '5 minutes', now() - make_interval(secs => %s))"
            " RETURNING id"
        )
        first = conn.execute(failing, ["orders", "k1", 3, "unroutable:\nNO_ROUTE", 120]).fetchone()[0]  # type: ignore[index]
        conn.execute(failing, ["orders", "k2", 1, "later", 60])
        other = conn.execute(failing, ["mail", None, 2, "refused", 30]).fetchone()[0]  # type: ignore[index]
        for n in range(3):  # due, and waiting 10, 20, 30 s
            fine = (
                "INSERT INTO outbox (topic, payload, created_at) VALUES (%s, '{}', now() - make_interval(secs => %s))"
            )
            conn.execute(fine, [f"fine-{n}", 10 * (n + 1)])
        conn.execute("INSERT INTO outbox (topic, payload, state, failed_at) VALUES ('orders', '{}', 'failed', now())")
        dead = conn.execute("INSERT INTO outbox (topic, payload, state) VALUES ('mail', '{}', 'failed') RETURNING id")
        dead_id = dead.fetchone()[0]  # type: ignore[index]
    url = ["--database-url", database_url]
    text = cli("status", *url).stdout
    assert "retrying: 3\n" in text and "failed: 2\n" in text
    lines = text.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("retrying, not dead-lettered yet")))
    assert lines[at + 1].split("\t")[:3] == ["  orders", "2", lines[at + 1].split("\t")[2]]
    assert f"event {first}, attempts=3" in lines[at + 1] and lines[at + 1].endswith("unroutable:\\nNO_ROUTE")
    assert lines[at + 2].startswith("  mail\t1\t") and lines[at + 2].endswith("refused")
    assert "pending by topic (5 of 5, oldest first)" in text
    shown = json.loads(cli("status", "--json", "--topics", "2", *url).stdout)
    # The lag is of due events: the retrying ones are not due, and have their own list.
    assert [t["topic"] for t in shown["topics"]] == ["fine-2", "fine-1"] and shown["topic_count"] == 5
    assert [t["pending"] for t in shown["topics"]] == [1, 1] and 29 < shown["topics"][0][
        "oldest_pending_age_seconds"
    ] < 90
    assert 119 < shown["oldest_retrying_age_seconds"] < 200
    assert {"pending", "in_flight", "failed", "oldest_pending_age_seconds"} <= set(shown)  # the contract's keys

    assert [d["topic"] for d in json.loads(cli("dead", "--json", "--topic", "mail", *url).stdout)] == ["mail"]

    assert json.loads(cli("inspect", str(first), "--json", *url).stdout)["retrying"] is True
    refused = cli("retry", "--id", str(dead_id), *url)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert f"event {dead_id} is not retrying" in refused.stderr and f"requeue --id {dead_id}" in refused.stderr
    done = cli("retry", "--id", str(other), *url)
    assert (done.returncode, done.stdout) == (0, "made 1 retrying events due now\n")
    assert json.loads(cli("retry", "--topic", "orders", "--json", *url).stdout)["retried"] == [first, first + 1]
    with psycopg.connect(database_url) as conn:
        due = conn.execute("SELECT count(*) FROM outbox WHERE attempts > 0 AND deliver_at <= now()").fetchone()
        assert due == (3,)
        assert conn.execute("SELECT sum(attempts) FROM outbox WHERE state = 'pending'").fetchone() == (6,)
