"""``migrate --create-roles``: column-level least privilege, checked write by write on real PostgreSQL.

Writers may insert only the application's columns (and read idempotency keys,
which ``ON CONFLICT (idempotency_key)`` needs); relays may update only the
columns they own and ``deliver_at``. Every other write is refused by the
database, whichever role tries it; and everything the relay and the producers
do still works under these roles.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import producers
from relay.config import TableName
from relay.store.base import Dead, ReplayFilter, RequeueFilter, Retry, Skipped
from relay.store.migrate import RELAY_COLUMNS, WRITER_COLUMNS, create_roles
from relay.store.postgres import PostgresAdmin, PostgresStore
from tests.conftest import _url_for

TABLE = TableName.parse("outbox")
ALL_COLUMNS = (
    "id", "topic", "key", "payload", "headers", "idempotency_key", "deliver_at", "priority", "state", "attempts",
    "last_error", "lease_owner", "claim_token", "lease_expires_at", "created_at", "published_at", "failed_at",
    "payload_bytes", "content_type",
)  # fmt: skip
#: A value of the right type for each column, for the writes that must be refused.
VALUES = {
    "id": "1000000", "topic": "'t2'", "key": "'k2'", "payload": "'{\"x\": 1}'", "headers": "'{\"h\": \"v\"}'",
    "idempotency_key": "'other'", "deliver_at": "'infinity'", "priority": "9", "state": "'sent'", "attempts": "99",
    "last_error": "'x'", "lease_owner": "'me'", "claim_token": "gen_random_uuid()",
    "lease_expires_at": "'infinity'", "created_at": "'2000-01-01'", "published_at": "now()", "failed_at": "now()",
    "payload_bytes": "'\\x00'", "content_type": "'a/b'",
}  # fmt: skip


@dataclass(frozen=True)
class Roles:
    relay: str
    writer: str
    relay_url: str  # a login user in the relay role
    writer_url: str  # a login user in the writer role


@pytest.fixture(scope="module")
def roles_database(pg_admin_url: str, migrated_template: str) -> Iterator[tuple[str, Roles]]:
    """One migrated database with the two roles, for the whole module: each refused write is rolled back."""
    suffix = uuid.uuid4().hex[:8]
    name = f"outbox_relay_roles_{suffix}"
    roles = {"relay": f"relay_{suffix}", "writer": f"writer_{suffix}"}
    users = {kind: f"{role}_login" for kind, role in roles.items()}
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}"')
    url = _url_for(name)
    try:
        create_roles(url, TABLE, relay_role=roles["relay"], writer_role=roles["writer"])
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            for kind, user in users.items():
                conn.execute(f'CREATE ROLE "{user}" LOGIN IN ROLE "{roles[kind]}"')
        info = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(url).items()}
        yield (
            url,
            Roles(
                roles["relay"],
                roles["writer"],
                psycopg.conninfo.make_conninfo(**{**info, "user": users["relay"]}),
                psycopg.conninfo.make_conninfo(**{**info, "user": users["writer"]}),
            ),
        )
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            for role in (*users.values(), *roles.values()):
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def refused(url: str, role: str, statement: str) -> bool:
    """Run ``statement`` as ``role`` and roll back: True if the database refused it for want of a privilege."""
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')")
        conn.execute(f'SET LOCAL ROLE "{role}"')
        try:
            conn.execute(statement)  # test SQL built from the constants above
        except psycopg.errors.InsufficientPrivilege:
            return True
        finally:
            conn.rollback()
    return False


WRITER_REFUSED = [
    *(
        f"INSERT INTO outbox (topic, payload, {column}) VALUES ('t', '{{}}', {VALUES[column]})"
        for column in ALL_COLUMNS
        if column not in WRITER_COLUMNS
    ),
    *(f"UPDATE outbox SET {column} = {VALUES[column]}" for column in ALL_COLUMNS),
    *(f"SELECT {column} FROM outbox" for column in ALL_COLUMNS if column != "idempotency_key"),
    "SELECT * FROM outbox",
    "DELETE FROM outbox",
    "TRUNCATE outbox",
    "INSERT INTO outbox (topic, payload) VALUES ('t', '{}') RETURNING id",
]
RELAY_REFUSED = [
    *(f"UPDATE outbox SET {column} = {VALUES[column]}" for column in ALL_COLUMNS if column not in RELAY_COLUMNS),
    "INSERT INTO outbox (topic, payload) VALUES ('t', '{}')",
    "TRUNCATE outbox",
    "DELETE FROM outbox_schema_version",
]


@pytest.mark.parametrize("statement", WRITER_REFUSED)
def test_the_writer_role_may_not(roles_database: tuple[str, Roles], statement: str) -> None:
    url, roles = roles_database
    assert refused(url, roles.writer, statement)


@pytest.mark.parametrize("statement", RELAY_REFUSED)
def test_the_relay_role_may_not(roles_database: tuple[str, Roles], statement: str) -> None:
    url, roles = roles_database
    assert refused(url, roles.relay, statement)


@pytest.mark.parametrize(
    ("kind", "statement"),
    [
        ("writer", "INSERT INTO outbox (topic, payload) VALUES ('t', '{}')"),
        (
            "writer",
            "INSERT INTO outbox (topic, key, payload, headers, idempotency_key, deliver_at, priority)"
            " VALUES ('t', 'k', '{}', '{}', 'i', now(), 1) ON CONFLICT (idempotency_key) DO NOTHING",
        ),
        ("writer", "INSERT INTO outbox (topic, payload_bytes, content_type) VALUES ('t', '\\x00ff', 'a/b')"),
        ("relay", "UPDATE outbox SET deliver_at = now(), attempts = 0, state = 'pending'"),
        ("relay", "SELECT * FROM outbox FOR UPDATE SKIP LOCKED"),
        ("relay", "DELETE FROM outbox"),
    ],
)
def test_what_each_role_may_do(roles_database: tuple[str, Roles], kind: str, statement: str) -> None:
    url, roles = roles_database
    assert not refused(url, roles.relay if kind == "relay" else roles.writer, statement)


def test_producers_publish_as_the_writer_role_including_a_repeated_key(roles_database: tuple[str, Roles]) -> None:
    _, roles = roles_database
    key = f"w-{uuid.uuid4().hex}"
    with psycopg.connect(roles.writer_url) as conn:
        assert producers.publish(conn, "t", {"n": 1}, key="k", headers={"h": "v"}, idempotency_key=key) == key
        assert producers.publish(conn, "t", {"n": 2}, idempotency_key=key) == key  # ON CONFLICT: nothing written
        later = datetime.now(UTC) + timedelta(hours=1)
        producers.publish(conn, "t", {}, deliver_at=later, priority=-1)
        conn.commit()

    async def asynchronously() -> str:
        async with await psycopg.AsyncConnection.connect(roles.writer_url) as conn:
            return await producers.apublish(conn, "t", {}, idempotency_key=key)

    assert asyncio.run(asynchronously()) == key
    with psycopg.connect(roles.writer_url) as conn:
        assert conn.execute("SELECT count(*) FROM outbox WHERE idempotency_key = %s", [key]).fetchone() == (1,)


def test_the_relay_and_the_operators_commands_run_as_the_relay_role(roles_database: tuple[str, Roles]) -> None:
    url, roles = roles_database
    with psycopg.connect(url) as conn:
        conn.execute("TRUNCATE outbox")
        for i in range(6):
            producers.publish(conn, "t", {"i": i}, key=f"k{i}", idempotency_key=f"r{i}")

    async def scenario() -> None:
        store = PostgresStore(roles.relay_url, TABLE, owner="r", lease_seconds=30, keep_sent=True)
        admin = PostgresAdmin(roles.relay_url, TABLE)
        await store.open()  # LISTEN included
        await admin.open()
        try:
            await store.check()
            claim = await store.claim(10, max_attempts=3)
            by_key = {e.idempotency_key: e.id for e in claim.events}
            assert len(by_key) == 6
            settled = await store.settle(
                claim,
                sent=[by_key["r0"], by_key["r1"]],
                retry=[Retry(by_key["r2"], 0, "again")],
                dead=[Dead(by_key["r3"], "refused")],
            )
            assert (settled.sent, settled.retried, settled.dead, settled.lost) == (2, 1, 1, 0)
            await store.release(claim, [by_key["r4"]], delay_seconds=0)
            await store.reap(max_attempts=3)
            await store.gauges()
            await store.wait(0.01)
            assert (await admin.status()).failed == 1
            assert [d.id for d in await admin.dead()] == [by_key["r3"]]
            assert await admin.requeue(RequeueFilter(id=by_key["r3"])) == [by_key["r3"]]
            assert await admin.skip(by_key["r3"], lease_grace_seconds=0) is Skipped.SKIPPED
            assert (await admin.inspect(by_key["r0"]) or {}).get("state") == "sent"
            assert sorted(await admin.replay(ReplayFilter(key="k0"))) == [by_key["r0"]]
            assert await admin.purge(0) == 2  # r1 (sent) and r3 (skipped)
        finally:
            await admin.close()
            await store.close()

    asyncio.run(scenario())


def test_create_roles_again_takes_back_the_table_wide_grants_of_earlier_versions(
    roles_database: tuple[str, Roles],
) -> None:
    url, roles = roles_database
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'GRANT INSERT, UPDATE ON outbox TO "{roles.writer}"')
        conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON outbox TO "{roles.relay}"')
    assert not refused(url, roles.writer, "INSERT INTO outbox (topic, payload, state) VALUES ('t', '{}', 'sent')")
    create_roles(url, TABLE, relay_role=roles.relay, writer_role=roles.writer)
    assert refused(url, roles.writer, "INSERT INTO outbox (topic, payload, state) VALUES ('t', '{}', 'sent')")
    assert refused(url, roles.writer, "UPDATE outbox SET topic = 'x'")
    assert refused(url, roles.relay, "UPDATE outbox SET payload = '{}'")
    assert refused(url, roles.relay, "INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")
    assert not refused(url, roles.writer, "INSERT INTO outbox (topic, payload) VALUES ('t', '{}')")
