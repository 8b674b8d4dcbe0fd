"""Every store call gives up on a frozen database: the operator's commands as much as the relay's.

A server that accepts bytes and answers nothing (a frozen VM, a stuck proxy or
pooler) defeats the statement timeout (the server never sees the statement)
and the TCP user timeout (every packet is acknowledged). Only the per-call
deadline ends the wait; these tests freeze the link with the fault proxy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from uuid import uuid4

import psycopg
import pytest

import producers
from relay.config import TableName
from relay.errors import StoreUnavailable
from relay.store.base import Claim, ReplayFilter, RequeueFilter
from relay.store.postgres import PostgresStore, connection
from tests.faults.proxy import FaultProxy

STATEMENT_TIMEOUT_SECONDS = 1.0
CALL_MARGIN_SECONDS = 0.5
#: The deadline (1.5 s), then psycopg's attempt to cancel the query (up to 10 s), then room for a loaded machine.
GIVES_UP_WITHIN_SECONDS = 20.0

CALLS: dict[str, Callable[[PostgresStore, int], Awaitable[Any]]] = {
    # The Admin port: what the CLI's commands call.
    "status": lambda s, i: s.status(),
    "dead": lambda s, i: s.dead(),
    "requeue": lambda s, i: s.requeue(RequeueFilter(id=i)),
    "skip": lambda s, i: s.skip(i, lease_grace_seconds=40),
    "inspect": lambda s, i: s.inspect(i),
    "purge": lambda s, i: s.purge(3600),
    "replay": lambda s, i: s.replay(ReplayFilter(all=True)),
    # The Store port: what the relay calls.
    "claim": lambda s, i: s.claim(10, max_attempts=3),
    "settle": lambda s, i: s.settle(Claim(uuid4(), []), sent=[i], retry=[], dead=[]),
    "release": lambda s, i: s.release(Claim(uuid4(), []), [i]),
    "reap": lambda s, i: s.reap(max_attempts=3),
    "gauges": lambda s, i: s.gauges(),
    "oldest_pending_age": lambda s, i: s.oldest_pending_age(),
    "check": lambda s, i: s.check(),
}


@pytest.fixture
def proxy(database_url: str) -> Iterator[FaultProxy]:
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    with FaultProxy(str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))) as running:
        yield running


def via(url: str, proxy: FaultProxy) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params.update(host="127.0.0.1", port=str(proxy.port))
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def frozen_store(database_url: str, proxy: FaultProxy) -> PostgresStore:
    return PostgresStore(
        via(database_url, proxy),
        TableName.parse("outbox"),
        owner="t",
        lease_seconds=30,
        listen=False,
        connect_timeout=GIVES_UP_WITHIN_SECONDS,  # longer than the deadline: the deadline must end the wait
        statement_timeout=STATEMENT_TIMEOUT_SECONDS,
    )


async def gives_up(call: Awaitable[Any]) -> float | str:
    """Seconds until ``call`` raised ``StoreUnavailable`` for want of an answer, or what happened instead."""
    started = time.monotonic()
    try:
        # The outer bound only turns a hang into a failure instead of a stuck test.
        await asyncio.wait_for(call, GIVES_UP_WITHIN_SECONDS * 2)
    except StoreUnavailable as exc:
        if "did not answer" in str(exc):
            return time.monotonic() - started
        return f"StoreUnavailable({exc})"
    except TimeoutError:
        return "hung"
    except Exception as exc:  # noqa: BLE001 - reported in the assertion
        return repr(exc)
    return "answered"


@pytest.fixture(autouse=True)
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "CALL_MARGIN_SECONDS", CALL_MARGIN_SECONDS)


def test_every_store_call_gives_up_on_a_frozen_server(database_url: str, proxy: FaultProxy) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, "t", {}, key="k")
        row = conn.execute("SELECT id FROM outbox").fetchone()
    assert row is not None
    stores = {name: frozen_store(database_url, proxy) for name in CALLS}

    async def scenario() -> dict[str, float | str]:
        # One store per call, all frozen at once: each call waits out its own deadline.
        await asyncio.gather(*(store.open() for store in stores.values()))
        proxy.blackhole()
        try:
            results = await asyncio.gather(*(gives_up(CALLS[name](stores[name], row[0])) for name in CALLS))
        finally:
            await asyncio.gather(*(store.close() for store in stores.values()))
        return dict(zip(CALLS, results, strict=True))

    results = asyncio.run(scenario())
    late = {name: result for name, result in results.items() if not isinstance(result, float)}
    late |= {
        name: f"{result:.1f}s"
        for name, result in results.items()
        if isinstance(result, float) and result > GIVES_UP_WITHIN_SECONDS
    }
    assert not late, f"calls that did not give up in time: {late}"


def test_opening_the_store_gives_up_on_a_frozen_server(database_url: str, proxy: FaultProxy) -> None:
    store = frozen_store(database_url, proxy)
    proxy.blackhole()

    async def scenario() -> float | str:
        try:
            return await gives_up(store.open())
        finally:
            await store.close()

    took = asyncio.run(scenario())
    assert isinstance(took, float) and took < GIVES_UP_WITHIN_SECONDS, took
