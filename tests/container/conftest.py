"""Fixtures of the container tests: the relay image built from the repository's Dockerfile,
and containers run from it against this machine's servers (host network), removed after.

``make container-test`` runs these tests; ``make test`` leaves them out (``norecursedirs``
in pyproject.toml): they need a container engine, and building the stand-in base takes a
minute. The engine, the base image and the figures are explained in ``engine.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from subprocess import CompletedProcess
from urllib.parse import quote

import psycopg
import pytest

from tests.container.engine import Base, Engine, EngineMissing, ensure_base, image_tag

#: Lines for the summary at the end of the run: sizes and start-up times.
FIGURES: list[str] = []
#: How long a relay container may take to answer /healthz (the image's health check allows 60 s).
START_TIMEOUT_SECONDS = 60.0
_names = itertools.count(1)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the figures measured on the way."""
    if FIGURES:
        terminalreporter.section("container figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The container engine (``CONTAINER_ENGINE``, else podman or docker)."""
    try:
        return Engine.from_environment()
    except EngineMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def base(engine: Engine) -> Base:
    """The Dockerfile's base image, in the engine (pulled, or the stand-in made or reused)."""
    started = time.monotonic()
    try:
        found = ensure_base(engine)
    except EngineMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    FIGURES.append(f"base {found.image}: {found.origin} in {time.monotonic() - started:.1f} s")
    return found


@pytest.fixture(scope="session")
def image(engine: Engine, base: Base) -> Iterator[str]:
    """The relay image, built from the Dockerfile for this run and removed after it."""
    tag = image_tag()
    started = time.monotonic()
    engine.build(tag)
    FIGURES.append(f"image built with {engine.name} in {time.monotonic() - started:.1f} s")
    try:
        yield tag
    finally:
        engine("rmi", "-f", tag, check=False)


class Containers:
    """Containers of the relay image that one test runs (host network); removed after it."""

    def __init__(self, engine: Engine, image: str) -> None:
        self.engine = engine
        self.image = image
        self._started: list[str] = []

    def _options(self, env: Mapping[str, str] | None, extra: tuple[str, ...]) -> list[str]:
        options = ["--network", "host", *extra]
        for name, value in (env or {}).items():
            options += ["-e", f"{name}={value}"]
        return options

    def run(
        self, *args: str, env: Mapping[str, str] | None = None, options: tuple[str, ...] = (), timeout: float = 120
    ) -> CompletedProcess[str]:
        """``ENGINE run --rm IMAGE ARGS``, a one-shot command such as ``migrate``; the caller judges its exit."""
        return self.engine("run", "--rm", *self._options(env, options), self.image, *args, timeout=timeout, check=False)

    def start(self, *args: str, env: Mapping[str, str] | None = None, options: tuple[str, ...] = ()) -> str:
        """Start a container in the background; its name."""
        name = f"outbox-relay-test-{os.getpid()}-{next(_names)}"
        self._started.append(name)
        self.engine("run", "-d", "--name", name, *self._options(env, options), self.image, *args)
        return name

    def stop(self, name: str, grace_seconds: float) -> tuple[int, float]:
        """``ENGINE stop`` (SIGTERM, SIGKILL after ``grace_seconds``): the exit code and how long it took."""
        started = time.monotonic()
        self.engine("stop", "-t", str(int(grace_seconds)), name, timeout=grace_seconds + 60)
        took = time.monotonic() - started
        return int(self.engine.inspect(name)["State"]["ExitCode"]), took

    def logs(self, name: str) -> str:
        """What the container wrote, stdout and stderr."""
        done = self.engine("logs", name)
        return done.stdout + done.stderr

    def exec(self, name: str, *command: str) -> CompletedProcess[str]:
        """Run ``command`` inside the running container, as the image's user."""
        return self.engine("exec", name, *command, check=False)

    def remove_all(self) -> None:
        """Remove every container this test started, running or not."""
        for name in self._started:
            self.engine.remove(name)


@pytest.fixture
def containers(engine: Engine, image: str) -> Iterator[Containers]:
    """Runs containers of the relay image for one test, and removes them after it."""
    running = Containers(engine, image)
    try:
        yield running
    finally:
        running.remove_all()


@pytest.fixture
def secret() -> str:
    """A password to hide: a new one each test, with the characters a URL must percent-encode."""
    return f"Pw-{uuid.uuid4().hex[:12]}-@:/?#%&"


@pytest.fixture
def relay_database(empty_database: str, secret: str) -> str:
    """A ``postgresql://`` URL to a new, empty database, with ``secret`` as its password (or the
    server's own password where the tests' server has one)."""
    info = psycopg.conninfo.conninfo_to_dict(empty_database)
    password = str(info.get("password") or secret)
    user = quote(str(info.get("user") or "postgres"), safe="")
    host, port = info.get("host") or "127.0.0.1", info.get("port") or 5432
    return f"postgresql://{user}:{quote(password, safe='')}@{host}:{port}/{info['dbname']}"


def spellings(secret: str) -> set[str]:
    """The ways a password may show: as written, and percent-encoded as in the URL."""
    return {secret, quote(secret, safe="")}


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET (an error status is returned, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def wait_for_healthz(port: int, timeout: float = START_TIMEOUT_SECONDS) -> float:
    """Seconds until ``/healthz`` on ``port`` answered 200; fails after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(OSError):
            if http_get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)[0] == 200:
                return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"/healthz on port {port} did not answer 200 within {timeout:.0f} s")
