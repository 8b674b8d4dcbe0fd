"""The docs' SQL runs against the current schema: every ```sql block, and every inline statement,
on PostgreSQL; every ```mysql block on MySQL (MariaDB here).

docs/mysql.md's inline code names MySQL statements in passing (`SET DEFAULT
ROLE`, no `UPDATE … RETURNING`): fragments, not run on either server.

Each runs in a transaction that is rolled back, except the few statements that
PostgreSQL will not run in one (VACUUM, the CONCURRENTLY forms), which run on
their own in the test's database.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from consumers.inbox import create_inbox

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK_RE = re.compile(r"```sql\n(.*?)```", re.S)
MYSQL_BLOCK_RE = re.compile(r"```mysql\n(.*?)```", re.S)
#: Pages whose inline SQL is MySQL's.
MYSQL_PAGES = (ROOT / "docs" / "mysql.md",)
#: An inline statement: a code span (it may wrap onto the next line) that starts with a statement's keywords.
INLINE_RE = re.compile(
    r"`((?:GRANT|REVOKE|ALTER ROLE|ALTER TABLE|ANALYZE|VACUUM|REINDEX|CREATE INDEX|SET|UPDATE) [^`]+)`"
)
#: What the docs leave to the reader: not runnable as written.
PLACEHOLDERS = ("...", "…", "$1")
OUTSIDE_A_TRANSACTION = ("VACUUM", "CONCURRENTLY")
#: Settings that only PostgreSQL 17 has, which the docs introduce as such.
SINCE_17 = ("transaction_timeout",)


def statements(block: str) -> list[str]:
    """The block's statements, comments dropped (no block has a ';' inside a string or a function body)."""
    bodies = (
        "\n".join(line for line in part.splitlines() if not line.strip().startswith("--")) for part in block.split(";")
    )
    return [body.strip() for body in bodies if body.strip()]


def blocks(pattern: re.Pattern[str]) -> list[object]:
    """The blocks ``pattern`` finds in the pages, each with its page and line as the test id."""
    return [
        pytest.param(
            block, id=f"{page.relative_to(ROOT)}:{page.read_text('utf-8')[: match.start()].count(chr(10)) + 1}"
        )
        for page in PAGES
        for match in pattern.finditer(page.read_text("utf-8"))
        for block in [match.group(1)]
    ]


BLOCKS = blocks(BLOCK_RE)
MYSQL_BLOCKS = blocks(MYSQL_BLOCK_RE)


INLINE = [
    pytest.param(" ".join(match.group(1).split()), id=f"{page.relative_to(ROOT)}: {' '.join(match.group(1).split())}")
    for page in PAGES
    if page not in MYSQL_PAGES
    for match in INLINE_RE.finditer(page.read_text("utf-8"))
    if not any(placeholder in match.group(1) for placeholder in PLACEHOLDERS)
]


def create_role(conn: psycopg.Connection[tuple[object, ...]], role: str) -> None:
    """``role``, in the test's transaction, unless the cluster has it (roles are the cluster's: a developer's
    own ``migrate --create-roles`` may have made ``outbox_writer``)."""
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone() is None:
        conn.execute(f"CREATE ROLE {role}")


def given(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """What the examples take as given: the application's and the relay's roles, and the application's tables."""
    for role in ("shop_app", "relay_login", "outbox_relay", "outbox_writer"):
        create_role(conn, role)
    conn.execute("CREATE TABLE orders (id integer PRIMARY KEY, status text)")
    create_inbox(conn)


@pytest.mark.parametrize("statement", INLINE)
def test_an_inline_sql_statement_of_the_docs_runs(database_url: str, statement: str) -> None:
    if any(word in statement for word in OUTSIDE_A_TRANSACTION):
        with psycopg.connect(database_url, autocommit=True) as conn:
            index = re.match(r"CREATE INDEX CONCURRENTLY (\w+)", statement)
            if index:  # an index that migrate builds: the docs show how to build it ahead of migrate
                conn.execute(f"DROP INDEX {index.group(1)}")
            conn.execute(statement)  # the docs' own text
        return
    with psycopg.connect(database_url) as conn:
        given(conn)
        conn.execute(statement)  # the docs' own text
        conn.rollback()


@pytest.mark.parametrize("block", BLOCKS)
def test_a_sql_block_of_the_docs_runs(database_url: str, block: str) -> None:
    with psycopg.connect(database_url) as conn:
        create_role(conn, "shop_app")
        conn.execute("CREATE TABLE orders (id integer PRIMARY KEY, status text)")
        create_inbox(conn)
        before_17 = conn.info.server_version < 170000
        for statement in statements(block):
            if before_17 and any(name in statement for name in SINCE_17):
                continue
            role = re.match(r"CREATE ROLE (\w+)", statement)
            if role and conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role.group(1)]).fetchone():
                continue  # the cluster has it already (roles are the cluster's): the rest of the block still runs
            conn.execute(statement)  # the docs' own text
        conn.rollback()


@pytest.mark.parametrize("block", MYSQL_BLOCKS)
def test_a_mysql_block_of_the_docs_runs(mysql_url: str, block: str) -> None:
    from tests.mysql_support import connect

    conn = connect(mysql_url, autocommit=False)
    try:
        with conn.cursor() as cur:
            for statement in statements(block):
                cur.execute(statement)  # the docs' own text
        conn.rollback()
    finally:
        conn.close()


def test_the_docs_have_mysql_blocks_to_run() -> None:
    assert len(MYSQL_BLOCKS) >= 2  # docs/mysql.md and README.md: a fence renamed back to sql would fail on PostgreSQL
