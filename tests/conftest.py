"""Fixtures shared by every test layer.

Integration and acceptance tests talk to real servers: PostgreSQL (a fresh
database per test, cloned from a migrated template), MariaDB (a fresh database
per test), RabbitMQ, and a Tansu broker started once per session. The databases
are made ahead of the tests and dropped behind them, in threads (tests.databases).
A missing server fails the run with a message saying how to start it.
"""

from __future__ import annotations

import compileall
import functools
import gc
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from devservers import Tansu
from relay.config import TableName
from relay.store.migrate import migrate
from tests.databases import Dropper, Stock
from tests.log_support import log_database, logical_server  # noqa: F401 - the log source's fixtures
from tests.services import AMQP_URL, MYSQL_URL, PG_URL, ensure_mysql, ensure_postgres, ensure_rabbitmq

TEMPLATE = f"outbox_relay_tpl_{os.getpid()}"
#: The packages the tests' subprocesses import: the CLI, the relay, the producers.
PROJECT_PACKAGES = ("relay", "producers", "devservers")
#: The suites ``make test`` runs on two pytest-xdist workers at once: each worker has its own
#: databases, queues and broker, and their tests wait mostly on subprocesses and servers. Every other
#: test is marked ``serial`` (below) and runs alone after them: tests/faults stops the shared
#: RabbitMQ and adds users to it, and unit and integration tests hold timing cases.
PARALLEL_SUITES = ("tests/acceptance", "tests/conformance")


def pytest_configure(config: pytest.Config) -> None:
    """Under PYTHONDONTWRITEBYTECODE, the project's modules compiled once for the session's subprocesses.

    The flag keeps Python from writing bytecode, so every ``python -m relay`` the tests start
    (hundreds of them) compiled each module of the relay it imported: a third of a ``run``'s
    start-up CPU. The flag still lets them read bytecode, so it is written here once, next to
    the sources as Python would without the flag (``__pycache__`` is ignored by git), and the
    directories this made are removed when the session ends. (PYTHONPYCACHEPREFIX would keep
    the tree clean but moves every module's cache there, the standard library's too.)
    """
    if not sys.flags.dont_write_bytecode:
        return
    root = config.rootpath
    for package in PROJECT_PACKAGES:
        made = [d for d in (root / package).rglob("*") if d.is_dir() and d.name != "__pycache__"]
        made = [d / "__pycache__" for d in [root / package, *made] if not (d / "__pycache__").exists()]
        compileall.compile_dir(root / package, quiet=2)
        for directory in made:
            config.add_cleanup(functools.partial(shutil.rmtree, directory, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test outside :data:`PARALLEL_SUITES` marked ``serial``: ``make test`` runs it alone."""
    parallel = [config.rootpath / suite for suite in PARALLEL_SUITES]
    for item in items:
        if not any(item.path.is_relative_to(suite) for suite in parallel):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    """The garbage collector's thresholds put back after each test: ``outbox-relay run`` sets them for its
    process (relay.app.tune_collector), and a test that runs it in this one, with ``serve`` stubbed however,
    would leave them to every test after it (which ones, pytest-randomly's order decides)."""
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)


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


def _create_database(admin_url: str, template: str | None = None) -> str:
    name = f"outbox_relay_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return name


def _drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_dropper(pg_admin_url: str) -> Iterator[Dropper]:
    """Drops the tests' PostgreSQL databases behind them (see tests.databases)."""
    dropper = Dropper(functools.partial(_drop_database, pg_admin_url))
    yield dropper
    dropper.close()


@pytest.fixture(scope="session")
def empty_stock(pg_admin_url: str, pg_dropper: Dropper) -> Iterator[Stock]:
    """New empty PostgreSQL databases, made ahead of the tests."""
    stock = Stock(functools.partial(_create_database, pg_admin_url), pg_dropper)
    yield stock
    stock.close()


@pytest.fixture(scope="session")
def migrated_stock(pg_admin_url: str, migrated_template: str, pg_dropper: Dropper) -> Iterator[Stock]:
    """New clones of the migrated template, made ahead of the tests."""
    stock = Stock(functools.partial(_create_database, pg_admin_url, migrated_template), pg_dropper)
    yield stock
    stock.close()


@pytest.fixture
def empty_database(empty_stock: Stock, pg_dropper: Dropper) -> Iterator[str]:
    """A URL to a new, empty database, dropped after the test."""
    name = empty_stock.take()
    yield _url_for(name)
    pg_dropper.put(name)


@pytest.fixture
def database_url(migrated_stock: Stock, pg_dropper: Dropper) -> Iterator[str]:
    """A URL to a new database with the ``outbox`` table migrated and empty."""
    name = migrated_stock.take()
    yield _url_for(name)
    pg_dropper.put(name)


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


def _create_mysql_database(server_url: str, *, migrated: bool) -> str:
    from relay.store.mysql.migrate import migrate as migrate_mysql
    from tests.mysql_support import execute as execute_mysql

    name = f"relay_test_{uuid.uuid4().hex[:12]}"
    execute_mysql(server_url, f"CREATE DATABASE `{name}`")
    if migrated:
        migrate_mysql(f"{server_url}/{name}", TableName.parse("outbox"))
    return name


@pytest.fixture(scope="session")
def mysql_dropper(mysql_server_url: str) -> Iterator[Dropper]:
    """Drops the tests' MySQL databases behind them."""
    from tests.mysql_support import execute as execute_mysql

    dropper = Dropper(lambda name: execute_mysql(mysql_server_url, f"DROP DATABASE IF EXISTS `{name}`"))
    yield dropper
    dropper.close()


@pytest.fixture(scope="session")
def mysql_empty_stock(mysql_server_url: str, mysql_dropper: Dropper) -> Iterator[Stock]:
    """New empty MySQL databases, made ahead of the tests."""
    stock = Stock(functools.partial(_create_mysql_database, mysql_server_url, migrated=False), mysql_dropper)
    yield stock
    stock.close()


@pytest.fixture(scope="session")
def mysql_migrated_stock(mysql_server_url: str, mysql_dropper: Dropper) -> Iterator[Stock]:
    """New MySQL databases with the ``outbox`` table migrated, made ahead of the tests (a migration takes
    most of a second on MariaDB)."""
    stock = Stock(functools.partial(_create_mysql_database, mysql_server_url, migrated=True), mysql_dropper)
    yield stock
    stock.close()


@dataclass
class MySQLSlot:
    """The test's MySQL database, once ``mysql_empty_url`` or ``mysql_url`` took one: the two share it."""

    name: str | None = None
    migrated: bool = False


@pytest.fixture
def mysql_slot(mysql_dropper: Dropper) -> Iterator[MySQLSlot]:
    """The test's MySQL database, dropped after the test."""
    slot = MySQLSlot()
    yield slot
    if slot.name is not None:
        mysql_dropper.put(slot.name)


@pytest.fixture
def mysql_empty_url(mysql_server_url: str, mysql_slot: MySQLSlot, request: pytest.FixtureRequest) -> str:
    """A URL to a new, empty MySQL database ``relay_test_*``, dropped after the test.

    With ``mysql_url`` in the same test, both are the one database, migrated (as when ``mysql_url``
    migrated this one)."""
    if mysql_slot.name is None:
        mysql_slot.name = request.getfixturevalue("mysql_empty_stock").take()
    return f"{mysql_server_url}/{mysql_slot.name}"


@pytest.fixture
def mysql_url(mysql_server_url: str, mysql_slot: MySQLSlot, request: pytest.FixtureRequest) -> str:
    """A URL to a new MySQL database with the ``outbox`` table migrated and empty."""
    from relay.store.mysql.migrate import migrate as migrate_mysql

    if mysql_slot.name is None:
        mysql_slot.name, mysql_slot.migrated = request.getfixturevalue("mysql_migrated_stock").take(), True
    url = f"{mysql_server_url}/{mysql_slot.name}"
    if not mysql_slot.migrated:
        migrate_mysql(url, TableName.parse("outbox"))
        mysql_slot.migrated = True
    return url
