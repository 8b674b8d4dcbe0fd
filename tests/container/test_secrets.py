"""A password in ``RELAY_DATABASE_URL`` stays out of everything the engine shows about a relay
container: its logs, its process (``inspect``, ``top``, ``/proc/1/cmdline``), its health."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from devservers import free_port
from tests.container.conftest import Containers, http_get, spellings, wait_for_healthz
from tests.container.engine import Engine
from tests.relay_support import wait_until

pytestmark = [pytest.mark.container, pytest.mark.timeout(180, func_only=True)]


def shown(engine: Engine, containers: Containers, name: str, port: int) -> dict[str, str]:
    """Everything the engine and the relay show about container ``name``, by where it showed."""
    inspected = engine.inspect(name)
    config = inspected["Config"]
    process = {key: inspected.get(key) for key in ("Path", "Args")}
    process |= {key: config.get(key) for key in ("Cmd", "Entrypoint")}
    cmdline = containers.exec(name, "cat", "/proc/1/cmdline")
    assert cmdline.returncode == 0, cmdline.stderr
    check = engine.health_check(name)
    health = inspected.get("State", {}).get("Health") or inspected.get("State", {}).get("Healthcheck") or {}
    return {
        "logs": containers.logs(name),
        "inspect (process)": json.dumps(process),
        "ps": engine("ps", "-a", "--no-trunc", "--filter", f"name={name}").stdout,
        "top": engine.top(name),
        "/proc/1/cmdline": cmdline.stdout.replace("\0", " "),
        "health check": check.stdout + check.stderr + json.dumps(health),
        "/healthz, /readyz, /metrics": "".join(
            http_get(f"http://127.0.0.1:{port}{path}")[1] for path in ("/healthz", "/readyz", "/metrics")
        ),
    }


def leaks(secret: str, places: dict[str, str]) -> list[str]:
    """Where any spelling of ``secret`` showed."""
    return [where for where, text in places.items() for spelling in spellings(secret) if spelling in text]


def test_a_working_relay_shows_no_password(
    engine: Engine, containers: Containers, relay_database: str, secret: str, amqp_url: str
) -> None:
    assert containers.run("migrate", env={"RELAY_DATABASE_URL": relay_database}).returncode == 0
    port = free_port()
    env = {"RELAY_DATABASE_URL": relay_database, "RELAY_SINK": amqp_url, "RELAY_METRICS_PORT": str(port)}
    name = containers.start(env=env)
    wait_for_healthz(port)
    # The check is worth something only if the relay was given the password.
    assert any(relay_database in variable for variable in engine.inspect(name)["Config"]["Env"])
    places = shown(engine, containers, name, port)
    assert "outbox-relay run" in places["/proc/1/cmdline"]
    assert leaks(secret, places) == []


def test_a_relay_that_cannot_reach_its_database_shows_no_password(
    engine: Engine, containers: Containers, secret: str, amqp_url: str
) -> None:
    # Nothing listens there: the relay keeps trying (and logging why) while it may start.
    unreachable = f"postgresql://postgres:{quote(secret, safe='')}@127.0.0.1:{free_port()}/shop"
    port = free_port()
    env = {
        "RELAY_DATABASE_URL": unreachable, "RELAY_SINK": amqp_url, "RELAY_METRICS_PORT": str(port),
        "RELAY_STARTUP_TIMEOUT": "60",
    }  # fmt: skip
    name = containers.start(env=env)
    wait_for_healthz(port)
    wait_until(lambda: "not started yet" in containers.logs(name), timeout=30, interval=0.2)
    assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 503
    assert leaks(secret, shown(engine, containers, name, port)) == []
    # A one-shot command's error, from the image, the same.
    done = containers.run("status", env={"RELAY_DATABASE_URL": unreachable})
    assert done.returncode != 0 and "error" in done.stderr, done
    assert leaks(secret, {"status": done.stdout + done.stderr}) == []
