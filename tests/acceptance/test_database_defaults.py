"""The relay reads what it wrote whatever a PostgreSQL database's session defaults say.

An operator may set DateStyle, IntervalStyle, extra_float_digits or the
isolation level for a database or a role (ALTER DATABASE ... SET). The relay's
own sessions pin the formats it reads and the level its claim is written for.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from psycopg import sql

import producers
from tests.acceptance.cli import cli
from tests.integration.rabbit_support import temp_queue
from tests.relay_support import RelayThread, outbox_counts, wait_until


@pytest.mark.parametrize(
    "defaults",
    [
        {"DateStyle": "SQL, DMY"},
        {"DateStyle": "German"},
        {"DateStyle": "Postgres, MDY", "IntervalStyle": "sql_standard"},
        {"extra_float_digits": "-15", "IntervalStyle": "iso_8601"},
        {"default_transaction_isolation": "serializable"},
        {"default_transaction_isolation": "repeatable read", "DateStyle": "SQL, YMD"},
    ],
    ids=lambda defaults: ",".join(f"{k}={v}" for k, v in defaults.items()),
)
def test_every_command_works_under_the_database_s_defaults(
    database_url: str, amqp_url: str, defaults: dict[str, str]
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        name = conn.info.dbname
        for setting, value in defaults.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)
                )
            )
    with temp_queue(amqp_url) as queue:
        with psycopg.connect(database_url) as conn:
            for i in range(20):
                producers.publish(conn, queue.name, {"i": i}, key=f"k{i % 3}", idempotency_key=f"e{i}")
            conn.execute(
                "INSERT INTO outbox (topic, payload, state, last_error, failed_at, created_at)"
                " VALUES ('t', '{}', 'failed', 'boom', now(), now() - interval '1234.567 s')"
            )
            (dead,) = conn.execute("SELECT id FROM outbox WHERE state = 'failed'").fetchone() or ()
            conn.execute(
                "INSERT INTO outbox (topic, payload, idempotency_key, created_at)"
                " VALUES (%s, '{}', 'old', now() - interval '1234.567 s')",
                [queue.name],
            )
            conn.execute(
                "INSERT INTO outbox (topic, payload, deliver_at) VALUES ('later', '{}', now() + interval '1 hour')"
            )
        status = cli("status", "--json", "--database-url", database_url)
        assert status.returncode == 0, status.stderr
        assert 1234 < json.loads(status.stdout)["oldest_pending_age_seconds"] < 1300
        for args in (["dead"], ["dead", "--json"], ["inspect", str(dead)], ["inspect", str(dead), "--json"]):
            done = cli(*args, "--database-url", database_url)
            assert done.returncode == 0 and not done.stderr, (args, done.stderr)
        with RelayThread(database_url, amqp_url):
            wait_until(lambda: outbox_counts(database_url) == {"pending": 1, "failed": 1}, timeout=30)
        received = [m.message_id or "" for m in queue.collect(21)]
        assert sorted(received) == sorted([*(f"e{i}" for i in range(20)), "old"])
        for key in range(3):
            mine = [int(r[1:]) for r in received if r.startswith("e") and int(r[1:]) % 3 == key]
            assert mine == sorted(mine)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT attempts FROM outbox WHERE topic = 'later'").fetchone() == (0,)
