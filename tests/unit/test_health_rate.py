"""/readyz runs its checks (a database UPDATE, a broker round trip) at a bounded rate, whatever the
rate of requests: concurrent probes share one check, and a finished check answers the probes of the
next READY_CHECK_INTERVAL_SECONDS."""

from __future__ import annotations

import asyncio
import time

from relay import health
from relay.health import HealthServer
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.memory import MemoryStore
from tests.unit.test_health import get
from tests.unit.test_loop import FAST


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.checks = 0

    async def check(self) -> None:
        self.checks += 1
        await asyncio.sleep(0.01)  # a round trip


class CountingSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.checks = 0

    async def check(self) -> None:
        self.checks += 1
        await super().check()


def test_readyz_checks_at_a_bounded_rate_whatever_the_request_rate() -> None:
    store, sink = CountingStore(), CountingSink()
    interval = health.READY_CHECK_INTERVAL_SECONDS
    assert 0.5 <= interval <= 5

    async def client(server: HealthServer, until: float, answers: list[bytes]) -> None:
        while time.monotonic() < until:
            answers.append(await get(server, b"GET /readyz HTTP/1.1\r\n\r\n"))

    async def scenario() -> None:
        server = HealthServer(Relay(store, sink, FAST), "127.0.0.1", 0)
        await server.start()
        server.started = True
        try:
            # 50 at once share one check.
            answers = await asyncio.gather(*(get(server, b"GET /readyz HTTP/1.1\r\n\r\n") for _ in range(50)))
            assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
            assert (store.checks, sink.checks) == (1, 1)
            # 20 clients asking without a pause for 1.5 intervals: one more check at most per interval.
            began = time.monotonic()
            answers = []
            await asyncio.gather(*(client(server, began + 1.5 * interval, answers) for _ in range(20)))
            elapsed = time.monotonic() - began
            assert len(answers) >= 40 and all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
            bound = 1 + int(elapsed / interval) + 1
            assert store.checks <= bound and sink.checks <= bound, (store.checks, len(answers), elapsed)
            assert store.checks >= 2  # and the result is refreshed: the database is asked again
            # A check's result is not kept past the interval: a sink gone since is seen.
            await asyncio.sleep(interval)
            sink.available = False
            assert (await get(server, b"GET /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 503 ")
        finally:
            await server.close()

    asyncio.run(scenario())
