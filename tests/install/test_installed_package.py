"""The package as a service installs it: built (``python -m build``), installed from the wheel into fresh
virtual environments, and used from there, never from the repository.

- a publishing service installs psycopg and the package with ``--no-deps``: it publishes, its
  consumer helpers work, and no broker client is there (``outbox-relay`` says in one line what
  to install);
- ``pip install outbox-relay`` (the wheel) gives the relay: ``migrate``, then ``run`` to Tansu and
  to RabbitMQ (the exchange declared by ``declare=topic``), each consumed by a small consumer
  through the ``consumers`` inbox;
- with the ``mysql`` extra, the relay on MariaDB, fed by a service that installed PyMySQL and the
  package without its dependencies.

``make install-test`` runs it (CI, after ``make test``); ``make test`` leaves it out (pyproject's
``--ignore=tests/install``): building and installing takes about a minute.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
import venv
import zipfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).with_name("service.py")
#: What a service that only publishes (and consumes through the inbox) installs besides the package.
PUBLISHING_REQUIREMENT = "psycopg[binary]>=3.2,<4"
#: All a publishing service's environment may hold (psycopg's own dependencies included).
PUBLISHING_DISTRIBUTIONS = {"outbox-relay", "psycopg", "psycopg-binary", "typing-extensions", "pip", "setuptools"}
BROKER_CLIENTS = {"confluent-kafka", "pika", "prometheus-client", "tenacity", "setproctitle"}
PRODUCT = {"relay", "producers", "consumers"}
EVENTS = 5
DRAIN_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0


def _run(
    command: list[str], *, timeout: float = 300, check: bool = True, **kw: Any
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV"}}
    env = {k: v for k, v in env.items() if not k.startswith(("RELAY_", "DATABASE_URL"))}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False, **kw)
    if check:
        assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


class Environment:
    """A fresh virtual environment outside the repository."""

    def __init__(self, where: Path) -> None:
        venv.create(where, with_pip=True)
        self.where = where
        self.bin = where / "bin"

    def pip(self, *args: str) -> None:
        _run([str(self.bin / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args])

    def distributions(self) -> set[str]:
        listed = _run(
            [str(self.bin / "python"), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"]
        )
        return {entry["name"].lower().replace("_", "-") for entry in json.loads(listed.stdout)}

    def service(self, *args: str) -> dict[str, Any]:
        done = _run([str(self.bin / "python"), str(SERVICE), *args], cwd=self.where, timeout=120)
        answer: dict[str, Any] = json.loads(done.stdout)
        assert answer.get("producers", str(self.where)).startswith(str(self.where)), answer
        return answer


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel ``python -m build`` makes from the sdist it makes first."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1 and list(out.glob("*.tar.gz")), list(out.iterdir())
    return wheels[0]


@pytest.fixture(scope="module")
def publisher(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """A publishing service's environment: psycopg, then the package without its dependencies."""
    env = Environment(tmp_path_factory.mktemp("publisher") / "venv")
    env.pip(PUBLISHING_REQUIREMENT)
    env.pip("--no-deps", str(wheel))
    return env


@pytest.fixture(scope="module")
def relay_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """The relay's environment, and a consumer's: the package with its dependencies."""
    env = Environment(tmp_path_factory.mktemp("relay") / "venv")
    env.pip(str(wheel))
    return env


def test_the_wheel_holds_only_the_product(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert tops - PRODUCT == {f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    for package in PRODUCT:
        assert f"{package}/py.typed" in names
    assert "relay/store/schema.sql" in names and any(n.startswith("relay/store/migrations/") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "outbox-relay = relay.launch:main" in entry_points


def test_a_publishing_service_gets_psycopg_and_no_broker_client(publisher: Environment, database_url: str) -> None:
    installed = publisher.distributions()
    assert installed <= PUBLISHING_DISTRIBUTIONS, installed - PUBLISHING_DISTRIBUTIONS
    assert not installed & BROKER_CLIENTS

    topic = f"install.{uuid.uuid4().hex[:8]}"
    published = publisher.service("publish", database_url, topic, str(EVENTS))
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT idempotency_key, payload FROM outbox WHERE topic = %s ORDER BY id", [topic])
        written = rows.fetchall()
    assert [key for key, _ in written] == published["keys"]
    assert written[0][1] == {"order_id": 0, "total": "9.90"}, "json_default=str writes a Decimal as its text"

    inbox = publisher.service("inbox", database_url)
    assert (inbox["processed"], inbox["skipped"]) == (["inbox-check"], ["inbox-check"])


@pytest.mark.parametrize("command", [["bin/outbox-relay"], ["bin/python", "-m", "relay"]])
@pytest.mark.parametrize("sink", ["kafka://127.0.0.1:9092", "amqp://guest:guest@127.0.0.1:5672/%2F"])
def test_the_relay_without_its_dependencies_says_what_to_install_in_one_line(
    publisher: Environment, database_url: str, command: list[str], sink: str
) -> None:
    program = [str(publisher.where / command[0]), *command[1:]]
    done = _run([*program, "run", "--database-url", database_url, "--sink", sink], check=False, cwd=publisher.where)
    assert done.returncode == 2, done
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("outbox-relay: the relay needs confluent-kafka, pika, tenacity, prometheus-client,")
    assert "pip install outbox-relay" in done.stderr and "Traceback" not in done.stderr
    # What needs only psycopg still works there: help, and the operator's commands.
    assert _run([*program, "--help"], cwd=publisher.where).stdout.startswith("usage: outbox-relay")
    assert json.loads(_run([*program, "status", "--json", "--database-url", database_url]).stdout)["pending"] == 0


class RelayProcess:
    """``outbox-relay run`` from the relay environment, stopped with SIGTERM."""

    def __init__(self, env: Environment, database_url: str, sink: str) -> None:
        self.process = subprocess.Popen(
            [str(env.bin / "outbox-relay"), "run", "--database-url", database_url, "--sink", sink],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=env.where,
        )

    def drain(self, database_url: str) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
        while time.monotonic() < deadline and self.process.poll() is None:
            with psycopg.connect(database_url) as conn:
                row = conn.execute("SELECT count(*) FROM outbox").fetchone()
            if row == (0,):
                return
            time.sleep(0.2)
        self.process.kill()
        raise AssertionError(f"the relay did not drain the outbox:\n{self.process.communicate()[0]}")

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        output = self.process.communicate(timeout=STOP_TIMEOUT_SECONDS)[0]
        assert self.process.returncode == 0, output
        return output


def test_the_installed_relay_delivers_to_kafka_and_rabbitmq_and_consumers_take_each_event_once(
    relay_env: Environment,
    publisher: Environment,
    empty_database: str,
    kafka_bootstrap: str,
    amqp_url: str,
) -> None:
    installed = relay_env.distributions()
    assert {"confluent-kafka", "pika", "psycopg"} <= installed
    _run([str(relay_env.bin / "outbox-relay"), "migrate", "--database-url", empty_database], cwd=relay_env.where)

    topic = f"install.{uuid.uuid4().hex[:8]}"
    keys = publisher.service("publish", empty_database, topic, str(EVENTS))["keys"]
    relay = RelayProcess(relay_env, empty_database, f"kafka://{kafka_bootstrap}")
    relay.drain(empty_database)
    relay.stop()
    got = relay_env.service("consume-kafka", empty_database, kafka_bootstrap, topic, str(EVENTS))
    # Each key on its partition: the order across keys is the partitions' interleaving.
    assert (sorted(got["processed"]), got["skipped"]) == (sorted(keys), got["processed"][:1])

    exchange, queue = f"install-{uuid.uuid4().hex[:8]}", f"install-{uuid.uuid4().hex[:8]}"
    relay_env.service("bind-rabbitmq", amqp_url, exchange, queue, "orders.#")
    keys = publisher.service("publish", empty_database, "orders.paid", str(EVENTS))["keys"]
    relay = RelayProcess(relay_env, empty_database, f"{amqp_url}?exchange={exchange}&declare=topic")
    relay.drain(empty_database)
    relay.stop()
    got = relay_env.service("consume-rabbitmq", empty_database, amqp_url, exchange, queue, str(EVENTS))
    assert (got["processed"], got["skipped"]) == (keys, keys[:1])


def test_the_mysql_extra_relays_from_mariadb_what_a_pymysql_service_published(
    wheel: Path,
    relay_env: Environment,
    tmp_path_factory: pytest.TempPathFactory,
    mysql_empty_url: str,
    kafka_bootstrap: str,
) -> None:
    from relay.store.mysql import Target
    from tests import mysql_support

    relay_env.pip(f"{wheel}[mysql]")
    assert {"pymysql", "asyncmy"} <= relay_env.distributions()
    service = Environment(tmp_path_factory.mktemp("mysql-publisher") / "venv")
    service.pip("PyMySQL>=1.1,<2", "psycopg[binary]>=3.2,<4")
    service.pip("--no-deps", str(wheel))
    assert not service.distributions() & BROKER_CLIENTS

    outbox_relay = str(relay_env.bin / "outbox-relay")
    _run([outbox_relay, "migrate", "--database-url", mysql_empty_url], cwd=relay_env.where)
    target = Target.parse(mysql_empty_url)
    topic = f"install.mysql.{uuid.uuid4().hex[:8]}"
    where = [target.host, str(target.port), target.user, target.database]
    keys = service.service("publish-mysql", *where, topic, str(EVENTS))["keys"]
    assert len(set(keys)) == EVENTS

    relay = RelayProcess(relay_env, mysql_empty_url, f"kafka://{kafka_bootstrap}")
    deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
    while mysql_support.execute(mysql_empty_url, "SELECT COUNT(*) FROM outbox")[0][0] and time.monotonic() < deadline:
        time.sleep(0.2)
    relay.stop()
    assert mysql_support.execute(mysql_empty_url, "SELECT COUNT(*) FROM outbox")[0][0] == 0
