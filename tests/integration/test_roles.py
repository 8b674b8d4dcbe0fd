"""``migrate --create-roles``: column-level least privilege, checked write by write on real PostgreSQL.

Writers may insert only the application's columns (and read idempotency keys,
which ``ON CONFLICT (idempotency_key)`` needs); relays may update only the
columns they own and ``deliver_at``. Every other write is refused by the
database, whichever role tries it; and everything the relay and the producers
do still works under these roles.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import producers
from relay.config import TableName
from relay.errors import ConfigError, SchemaError
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
        with pytest.raises(producers.IdempotencyKeyTaken):  # another topic: another writer's event
            producers.publish(conn, "other", {"n": 2}, idempotency_key=key)
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


@pytest.fixture
def spare_roles(pg_admin_url: str, database_url: str) -> Iterator[dict[str, str]]:
    """A relay, a writer, an owner and another role, made in the test's database and dropped after it."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"{kind}_{suffix}" for kind in ("relay", "writer", "owner", "other")}
    with psycopg.connect(database_url, autocommit=True) as conn:
        for role in names.values():
            conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
        conn.execute(f'ALTER TABLE outbox OWNER TO "{names["owner"]}"')
    yield names
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outbox OWNER TO CURRENT_USER")
        for role in names.values():
            conn.execute(f'DROP OWNED BY "{role}"')
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        for role in names.values():
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def acl(url: str) -> tuple[object, ...]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname, relacl::text, (SELECT array_agg(attacl::text ORDER BY attnum) FROM pg_attribute"
            " WHERE attrelid = c.oid) FROM pg_class AS c WHERE relname LIKE 'outbox%%' ORDER BY relname"
        ).fetchall()
    return tuple(rows)


#: Roles that can do anything on the table whatever it is granted: create_roles stripped the owner's own
#: privileges (REVOKE ALL) and said "granted", or gave one role both sets.
UNFIT = {
    "the writer is the superuser running migrate": ("CURRENT_USER", "writer", "superuser"),
    "the writer owns the table": ("{owner}", "writer", "owns table"),
    "the relay owns the table": ("{owner}", "relay", "owns table"),
    "the writer is a member of the owner": ("{writer}", "writer", "member of its owner"),
    "the writer is a member of the relay": ("{writer}", "writer", "is a member of"),
    "the relay is a member of the writer": ("{relay}", "relay", "is a member of"),
}


@pytest.mark.parametrize("case", UNFIT)
def test_create_roles_refuses_a_role_that_can_act_as_the_owner_or_the_other_role_and_changes_nothing(
    database_url: str, spare_roles: dict[str, str], case: str
) -> None:
    given, flag, reason = UNFIT[case]
    roles = dict(spare_roles)
    with psycopg.connect(database_url, autocommit=True) as conn:
        if case == "the writer is a member of the owner":
            conn.execute(f'GRANT "{roles["owner"]}" TO "{roles["writer"]}"')
        elif case == "the writer is a member of the relay":
            conn.execute(f'GRANT "{roles["relay"]}" TO "{roles["writer"]}"')
        elif case == "the relay is a member of the writer":
            conn.execute(f'GRANT "{roles["writer"]}" TO "{roles["relay"]}"')
        current = str((conn.execute("SELECT current_user").fetchone() or ("",))[0])
    roles[flag] = current if given == "CURRENT_USER" else given.format(**spare_roles)
    before = acl(database_url)
    with pytest.raises(ConfigError, match=f"--{flag}-role .*{reason}"):
        create_roles(database_url, TABLE, relay_role=roles["relay"], writer_role=roles["writer"])
    assert acl(database_url) == before


#: Privileges that reach a role from outside its own grants, which create_roles then reported as least privilege.
REACHING = {
    "SELECT to PUBLIC": ("GRANT SELECT ON outbox TO PUBLIC", "writer", "SELECT (id, topic"),
    "UPDATE of payload to PUBLIC": ("GRANT UPDATE (payload) ON outbox TO PUBLIC", "relay", "UPDATE (payload)"),
    "DELETE to a role the writer inherits": ('GRANT DELETE ON outbox TO "{other}"', "writer", "DELETE on"),
    "INSERT to a role the relay inherits": ('GRANT INSERT ON outbox TO "{other}"', "relay", "INSERT (id"),
    "TRUNCATE to PUBLIC": ("GRANT TRUNCATE ON outbox TO PUBLIC", "relay", "TRUNCATE on"),
    "the version table to PUBLIC": ("GRANT DELETE ON outbox_schema_version TO PUBLIC", "relay", "DELETE on"),
    "the id sequence to PUBLIC": ("GRANT UPDATE ON SEQUENCE outbox_id_seq TO PUBLIC", "relay", "UPDATE on"),
    "pg_write_all_data": ('GRANT pg_write_all_data TO "{writer}"', "writer", "UPDATE (id"),
}


@pytest.mark.parametrize("case", REACHING)
def test_create_roles_refuses_privileges_that_reach_a_role_through_public_or_membership(
    database_url: str, spare_roles: dict[str, str], case: str
) -> None:
    grant, kind, shown = REACHING[case]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for role in ("relay", "writer"):
            conn.execute(f'GRANT "{spare_roles["other"]}" TO "{spare_roles[role]}"')
        conn.execute(grant.format(**spare_roles))
    with pytest.raises(SchemaError, match=f"role '{spare_roles[kind]}' may still do more.*{re.escape(shown)}"):
        create_roles(database_url, TABLE, relay_role=spare_roles["relay"], writer_role=spare_roles["writer"])


@pytest.mark.parametrize(
    "grant",
    [
        'GRANT INSERT, UPDATE, DELETE, TRUNCATE ON outbox_schema_version TO "{relay}"',
        'GRANT SELECT, INSERT ON outbox_schema_version TO "{writer}"',
        'GRANT USAGE, UPDATE ON SEQUENCE outbox_id_seq TO "{writer}"',
        'GRANT SELECT, UPDATE ON SEQUENCE outbox_id_seq TO "{relay}"',
    ],
)
def test_create_roles_again_takes_back_grants_on_the_version_table_and_the_id_sequence(
    database_url: str, spare_roles: dict[str, str], grant: str
) -> None:
    relay, writer = spare_roles["relay"], spare_roles["writer"]
    create_roles(database_url, TABLE, relay_role=relay, writer_role=writer)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(grant.format(**spare_roles))
    create_roles(database_url, TABLE, relay_role=relay, writer_role=writer)
    with psycopg.connect(database_url) as conn:
        held = conn.execute(
            "SELECT r, p, has_table_privilege(r, 'outbox_schema_version', p) FROM unnest(%s::text[]) AS r,"
            " unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS p"
            " UNION ALL SELECT r, p, has_sequence_privilege(r, 'outbox_id_seq', p) FROM unnest(%s::text[]) AS r,"
            " unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) AS p",
            [[relay, writer], [relay, writer]],
        ).fetchall()
    # The relay reads the schema version, and nothing else here.
    assert {(role, privilege) for role, privilege, granted in held if granted} == {(relay, "SELECT")}


def privilege_matrix(conn: psycopg.Connection[tuple[Any, ...]], role: str) -> dict[str, bool]:
    """Every privilege ``role`` may use on the outbox, its columns, its version table and its id sequence."""
    rows = conn.execute(
        "SELECT a.attname || ' ' || p, has_column_privilege(%(role)s, 'outbox', a.attname, p)"
        " FROM pg_attribute AS a, unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) AS p"
        " WHERE a.attrelid = 'outbox'::regclass AND a.attnum > 0 AND NOT a.attisdropped"
        " UNION ALL SELECT t || ' ' || p, has_table_privilege(%(role)s, t, p)"
        " FROM unnest(ARRAY['outbox', 'outbox_schema_version']) AS t,"
        " unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) AS p"
        " UNION ALL SELECT 'sequence ' || p, has_sequence_privilege(%(role)s, 'outbox_id_seq', p)"
        " FROM unnest(ARRAY['USAGE', 'SELECT', 'UPDATE']) AS p"
        " UNION ALL SELECT 'schema USAGE', has_schema_privilege(%(role)s, 'public', 'USAGE')",
        {"role": role},
    ).fetchall()
    return {str(name): bool(granted) for name, granted in rows}


def test_the_grants_by_hand_in_operations_md_are_those_of_create_roles(pg_admin_url: str, database_url: str) -> None:
    # The page's writer grant lacked payload_bytes and content_type: writers granted by hand could not publish bytes.
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text("utf-8")
    (block,) = [b for b in re.findall(r"```sql\n(.*?)```", page, re.S) if "CREATE ROLE outbox_relay NOLOGIN" in b]
    suffix = uuid.uuid4().hex[:8]
    by_hand = {"relay": f"hand_relay_{suffix}", "writer": f"hand_writer_{suffix}"}
    made = {"relay": f"made_relay_{suffix}", "writer": f"made_writer_{suffix}"}
    block = block.replace("outbox_relay", by_hand["relay"]).replace("outbox_writer", by_hand["writer"])
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            for statement in block.split(";"):
                lines = [line for line in statement.splitlines() if not line.strip().startswith("--")]
                text = "\n".join(lines).strip()
                if text and "relay_login" not in text and "shop_app" not in text:  # the page's own login roles
                    conn.execute(text.encode())
        create_roles(database_url, TABLE, relay_role=made["relay"], writer_role=made["writer"])
        with psycopg.connect(database_url) as conn:
            for kind in ("relay", "writer"):
                assert privilege_matrix(conn, by_hand[kind]) == privilege_matrix(conn, made[kind]), kind
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            for role in (*by_hand.values(), *made.values()):
                conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            for role in (*by_hand.values(), *made.values()):
                conn.execute(f"DROP ROLE IF EXISTS {role}")
