"""Run a relay in a background thread (in-process) or a subprocess (as a user would)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import psycopg

from relay.app import RunConfig, build_relay, start
from relay.config import RelaySettings, TableName, parse_sink_url, resolve_routes
from relay.loop import Relay
from relay.store.postgres import PostgresStore

FAST = RelaySettings(
    batch_size=200,
    max_attempts=3,
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
    # The shortest lease that holds a claim, a publish and a settle on either broker.
    lease_seconds=15,
    publish_timeout_seconds=3,
    poll_interval_seconds=0.05,
    poll_interval_max_seconds=0.2,
)


class RelayThread:
    """A relay on its own event loop in a thread; ``stop()`` waits for it to finish.

    ``routes=["PATTERN=URL", ...]`` routes topics as ``--route`` does; ``sink_url``
    may then be empty, or is the catch-all route as ``--sink`` is.
    """

    def __init__(self, database_url: str, sink_url: str, settings: RelaySettings = FAST, **kw: Any) -> None:
        routes = kw.pop("routes", ())
        self.config = RunConfig(
            database_url=database_url,
            table=TableName.parse(kw.pop("table", "outbox")),
            keep_sent=kw.pop("keep_sent", False),
            sink=parse_sink_url(sink_url) if sink_url else None,
            routes=resolve_routes(routes, sink_url or None),
            event_source=kw.pop("event_source", None),
            settings=replace(settings, **kw),
        )
        self.relay: Relay | None = None
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> RelayThread:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("relay did not start")
        if self.error:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.relay = build_relay(self.config)
            await start(self.relay, 10)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            self.error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self.relay.run(self._stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            self.error = exc

    def stop(self, timeout: float = 30) -> None:
        """Set the stop event and wait for the loop to drain."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("relay did not stop")
        if self.error:
            raise self.error


@contextlib.asynccontextmanager
async def opened_store(database_url: str, **options: Any) -> AsyncIterator[PostgresStore]:
    """A PostgreSQL store on the ``outbox`` table, open for the block; ``options`` go to the store."""
    store = PostgresStore(database_url, TableName.parse("outbox"), owner="t", lease_seconds=30, listen=False, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def relay_process(
    database_url: str, sink_url: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """``outbox-relay run`` as a subprocess with fast test settings."""
    # The shortest lease that holds a claim, a publish and a settle on this broker (RabbitMQ's close takes longer).
    lease = "10" if sink_url.startswith("kafka") else "15"
    args = [
        sys.executable, "-m", "relay", "run", "--database-url", database_url, "--sink", sink_url,
        "--batch-size", "200", "--max-attempts", "3", "--backoff-initial", "0.05", "--backoff-max", "0.2",
        "--lease-seconds", lease, "--publish-timeout", "3", "--poll-interval", "0.05", "--poll-interval-max", "0.2",
        "--log-level", "WARNING", *extra,
    ]  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    return subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**base, **(env or {})}
    )


def stop_process(proc: subprocess.Popen[str], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    """Signal ``proc`` and return its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def outbox_counts(database_url: str, table: str = "outbox") -> dict[str, int]:
    """Rows per state."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(f"SELECT state, count(*) FROM {table} GROUP BY state").fetchall()
    return {state: int(n) for state, n in rows}


def wait_until(predicate: Any, timeout: float = 30, interval: float = 0.05) -> None:
    """Poll ``predicate`` until true or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def status_json(database_url: str) -> dict[str, Any]:
    """``outbox-relay status --json``."""
    out = subprocess.run(
        [sys.executable, "-m", "relay", "status", "--json", "--database-url", database_url],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result
