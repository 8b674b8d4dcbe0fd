"""A PostgreSQL database not encoded in UTF8 is refused by every command and by publish(), before any write.

On SQL_ASCII the server stores each writer's bytes as its client encoding made
them (one key, two spellings; the relay read text as bytes and crashed on every
claim); on LATIN1 and the like, jsonb refuses the escapes of non-ASCII text.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

import producers
from relay.config import TableName
from relay.store.sql import render, schema_template
from tests.acceptance.cli import cli
from tests.conftest import _url_for


@pytest.fixture(params=["SQL_ASCII", "LATIN1", "WIN1252"])
def foreign_database(request: pytest.FixtureRequest, pg_admin_url: str) -> Iterator[tuple[str, str]]:
    """A database in another encoding, holding an outbox table made before the check existed."""
    encoding = request.param
    name = f"outbox_relay_enc_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(name), sql.Literal(encoding)
            )
        )
    url = _url_for(name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(render(schema_template(), TableName.parse("public.outbox")))  # qualified, as migrate renders it
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}')")
    yield url, encoding
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.mark.parametrize(
    "args",
    [
        ["migrate"],
        ["status"],
        ["dead"],
        ["run", "--sink", "amqp://guest:guest@127.0.0.1:5672/%2F", "--startup-timeout", "5"],
    ],
)
def test_every_command_refuses_a_database_not_in_utf8(foreign_database: tuple[str, str], args: list[str]) -> None:
    url, encoding = foreign_database
    done = cli(*args, "--database-url", url)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"is encoded in {encoding}: the outbox needs a UTF8 database" in done.stderr
    assert "Traceback" not in done.stderr
    with psycopg.connect(url) as conn:  # nothing claimed: the row is as it was written
        assert conn.execute("SELECT attempts, lease_expires_at FROM outbox").fetchall() == [(0, None)]


def test_publish_refuses_a_database_not_in_utf8_before_any_sql(foreign_database: tuple[str, str]) -> None:
    url, encoding = foreign_database
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TEMP TABLE business (n int)")
        conn.execute("INSERT INTO business VALUES (1)")
        for key in ("caf\u00e9", "plain"):
            with pytest.raises(ValueError, match=f"encoded in {encoding}: the outbox needs a UTF8 database"):
                producers.publish(conn, "t", {"n": "\u00e9"}, key=key)
            with pytest.raises(ValueError, match="needs a UTF8 database"):
                producers.publish(conn.cursor(), "t", {"n": 1}, key=key)
        # The caller's transaction goes on untouched.
        assert conn.execute("SELECT count(*) FROM business").fetchone() == (1,)

    async def asynchronous() -> None:
        async with await psycopg.AsyncConnection.connect(url) as aconn:
            with pytest.raises(ValueError, match="needs a UTF8 database"):
                await producers.apublish(aconn, "t", {"n": 1}, key="k")
            assert aconn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    asyncio.run(asynchronous())
