"""Fixtures shared by every test layer.

Integration and acceptance tests talk to real servers: PostgreSQL (a fresh
database per test, cloned from a migrated template), RabbitMQ, and a Tansu
broker started once per session. A missing server fails the run with a
message saying how to start it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from devservers import Tansu
from relay.config import TableName
from relay.store.migrate import migrate
from tests.log_support import log_database, logical_server  # noqa: F401 - the log source's fixtures
from tests.services import AMQP_URL, MYSQL_URL, PG_URL, ensure_mysql, ensure_postgres, ensure_rabbitmq

TEMPLATE = f"outbox_relay_tpl_{os.getpid()}"


def _url_for(database: str) -> str:
    conninfo = psycopg.conninfo.conninfo_to_dict(PG_URL)
    conninfo["dbname"] = database
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in conninfo.items()})


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """A URL to a database where tests may CREATE DATABASE."""
    problem = ensure_postgres()
    if problem:
        pytest.fail(problem, pytrace=False)
    return PG_URL


@pytest.fixture(scope="session")
def migrated_template(pg_admin_url: str) -> Iterator[str]:
    """A database with the default outbox table migrated, used as a template."""
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    migrate(_url_for(TEMPLATE), TableName.parse("outbox"))
    yield TEMPLATE
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


@pytest.fixture
def empty_database(pg_admin_url: str) -> Iterator[str]:
    """A URL to a new, empty database, dropped after the test."""
    name = f"outbox_relay_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield _url_for(name)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(pg_admin_url: str, migrated_template: str) -> Iterator[str]:
    """A URL to a new database with the ``outbox`` table migrated and empty."""
    name = f"outbox_relay_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{migrated_template}"')
    yield _url_for(name)
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a Tansu broker running for the whole session."""
    with Tansu() as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The RabbitMQ URL (guest on the local server)."""
    problem = ensure_rabbitmq()
    if problem:
        pytest.fail(problem, pytrace=False)
    return AMQP_URL


@pytest.fixture(scope="session")
def mysql_server_url() -> str:
    """A ``mysql://`` URL (no database) to a server where tests may CREATE DATABASE."""
    problem = ensure_mysql()
    if problem:
        pytest.fail(problem, pytrace=False)
    return MYSQL_URL.rstrip("/")


@pytest.fixture
def mysql_empty_url(mysql_server_url: str) -> Iterator[str]:
    """A URL to a new, empty MySQL database ``relay_test_*``, dropped after the test."""
    from tests.mysql_support import mysql_database

    with mysql_database(mysql_server_url) as url:
        yield url


@pytest.fixture
def mysql_url(mysql_empty_url: str) -> str:
    """A URL to a new MySQL database with the ``outbox`` table migrated and empty."""
    from relay.store.mysql.migrate import migrate as migrate_mysql

    migrate_mysql(mysql_empty_url, TableName.parse("outbox"))
    return mysql_empty_url
