"""The Kafka sink keeps a key's order with several of its events in flight (real Tansu).

Events after the first of a key in the relay's hands are ``chained``, as the
claim marks them; the sink admits each through :class:`relay.holds.KeyHolds`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

import pytest

from devservers import Tansu
from relay.config import KafkaSinkConfig
from relay.errors import SinkTimeout, SinkUnavailable
from relay.events import HELD, IDEMPOTENCY_HEADER, Event, Outcome
from relay.holds import KeyHolds
from relay.sinks.kafka import KafkaSink
from tests.integration.kafka_support import Received, consume, make_event, running_tansu, unique_topic

pytestmark = pytest.mark.timeout(120)

PUBLISH_TIMEOUT_SECONDS = 3.0


def make_sink(
    bootstrap: str, *, publish_timeout_seconds: float = PUBLISH_TIMEOUT_SECONDS, options: dict[str, str] | None = None
) -> KafkaSink:
    return KafkaSink(
        KafkaSinkConfig(bootstrap_servers=bootstrap, options=options or {}),
        publish_timeout_seconds=publish_timeout_seconds,
        connect_timeout_seconds=3.0,
    )


def runs(topic: str, pattern: list[tuple[str, int]], seen: set[str] | None = None, **kwargs: bytes) -> list[Event]:
    """Runs of events, ``(key, length)`` each, chained as a claim marks them (``seen``: keys in flight)."""
    seen = set() if seen is None else seen
    events = []
    for key, length in pattern:
        for _ in range(length):
            events.append(replace(make_event(topic, key=key), chained=key in seen))
            seen.add(key)
    return events


def by_key(received: list[Received]) -> dict[str, list[str]]:
    """Each key's idempotency keys in log order (partition, offset)."""
    placed: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for m in received:
        assert m.key is not None
        placed[m.key.decode()].append((m.partition, m.offset, m.headers[IDEMPOTENCY_HEADER].decode()))
    return {key: [ik for _, _, ik in sorted(rows)] for key, rows in placed.items()}


def first_copies(order: list[str]) -> list[str]:
    """``order`` with every later copy of an idempotency key dropped (what a deduplicating consumer sees)."""
    return list(dict.fromkeys(order))


def expected_by_key(events: list[Event]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for e in events:
        assert e.key is not None
        out[e.key].append(e.idempotency_key)
    return dict(out)


@pytest.fixture
def tansu() -> Iterator[Tansu]:
    """A broker of the test's own: these tests freeze, stop and restart it."""
    with running_tansu() as broker:
        yield broker


def test_runs_of_several_keys_in_pipelined_batches_arrive_in_order(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    seen: set[str] = set()
    first = runs(topic, [("a", 30), ("b", 5), ("a", 20), ("c", 40), ("b", 25), ("a", 1)], seen)
    second = runs(topic, [("c", 10), ("a", 30), ("b", 30), ("d", 3)], seen)
    holds = KeyHolds()

    async def scenario() -> list[list[Outcome]]:
        sink = make_sink(kafka_bootstrap)
        await sink.start()
        try:
            return list(await asyncio.gather(sink.publish(first, holds), sink.publish(second, holds)))
        finally:
            await sink.close()

    assert asyncio.run(scenario()) == [[None] * len(first), [None] * len(second)]
    received = consume(kafka_bootstrap, topic, count=len(first) + len(second))
    assert by_key(received) == expected_by_key(first + second)


def test_a_synchronous_failure_mid_run_holds_the_rest_of_that_key(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    seen: set[str] = set()
    first = runs(topic, [("k", 3), ("x", 2)], seen)
    oversized = replace(make_event(topic, key="k", payload=b'"' + b"x" * 5000 + b'"'), chained=True)
    first += [oversized, *runs(topic, [("k", 2), ("y", 2), ("x", 1)], seen)]
    second = runs(topic, [("k", 2), ("x", 2), ("z", 1)], seen)
    holds = KeyHolds()

    async def scenario() -> list[list[Outcome]]:
        sink = make_sink(kafka_bootstrap, options={"message.max.bytes": "2000"})
        await sink.start()
        try:
            # The second call is made before the first returned: it is judged after the first's refusal.
            return list(await asyncio.gather(sink.publish(first, holds), sink.publish(second, holds)))
        finally:
            await sink.close()

    one, two = asyncio.run(scenario())

    assert one[:5] == [None] * 5
    refused = one[5]
    assert refused is not None and refused.permanent and "MSG_SIZE_TOO_LARGE" in refused.error
    assert one[6:8] == [HELD, HELD]
    assert one[8:] == [None] * 3
    assert two == [HELD, HELD, None, None, None]
    assert holds.held("k") and not holds.held("x")
    delivered = [e for e, o in zip(first + second, one + two, strict=True) if o is None]
    received = consume(kafka_bootstrap, topic, count=len(delivered))
    assert by_key(received) == expected_by_key(delivered)
    assert [e.key for e in delivered].count("k") == 3


def test_a_publish_deadline_purges_and_a_new_producer_takes_over(tansu: Tansu) -> None:
    topic = unique_topic()
    seen: set[str] = set()
    warm = runs(topic, [("a", 1), ("b", 1)], set())
    stuck = runs(topic, [("a", 5), ("b", 5)], seen)
    queued = runs(topic, [("a", 3)], seen)
    holds = KeyHolds()
    timeout = 1.5

    async def scenario() -> None:
        sink = make_sink(tansu.bootstrap, publish_timeout_seconds=timeout)
        await sink.start()
        try:
            assert await sink.publish(warm, holds) == [None, None]
            old = sink._client
            assert tansu._process is not None
            os.kill(tansu._process.pid, signal.SIGSTOP)  # connected, but answering nothing
            try:
                await asyncio.sleep(0.2)
                began = time.monotonic()
                results = await asyncio.gather(
                    sink.publish(stuck, holds), sink.publish(queued, holds), return_exceptions=True
                )
                # One deadline retired the producer: both batches answered by then.
                assert time.monotonic() - began < timeout + 1.0
            finally:
                os.kill(tansu._process.pid, signal.SIGCONT)
            for result in results:
                assert isinstance(result, SinkTimeout), results
            assert holds.held("a") and holds.held("b")
            # A chained event of a held key is not tried on the new producer.
            late = replace(make_event(topic, key="a"), chained=True)
            assert await sink.publish([late], holds) == [HELD]
            # The relay gives the batches back; claimed again, their first events are no longer chained.
            again = [replace(e, chained=n > 0) for n, e in enumerate(e for e in stuck + queued if e.key == "a")]
            again += [replace(e, chained=n > 0) for n, e in enumerate(e for e in stuck if e.key == "b")]
            assert await sink.publish(again, holds) == [None] * len(again)
            assert sink._client is not old
        finally:
            await sink.close()

    asyncio.run(scenario())
    received = consume(tansu.bootstrap, topic, count=2 + len(stuck) + len(queued))
    # The frozen broker may still have stored what was in flight: copies, but in order once deduplicated.
    order = {key: first_copies(iks) for key, iks in by_key(received).items()}
    assert order == expected_by_key(
        warm + [e for e in stuck + queued if e.key == "a"] + [e for e in stuck if e.key == "b"]
    )


def test_the_sink_delivers_again_after_the_broker_restarts(tansu: Tansu) -> None:
    topic = unique_topic()
    holds = KeyHolds()
    delivered: list[Event] = []

    async def scenario() -> float:
        sink = make_sink(tansu.bootstrap)
        await sink.start()
        try:
            seen: set[str] = set()
            batch = runs(topic, [("a", 3), ("b", 3)], seen)
            assert await sink.publish(batch, holds) == [None] * 6
            tansu.stop()
            tansu.start()  # same port, empty (Tansu keeps everything in memory)
            restarted = time.monotonic()
            deadline = restarted + 60
            while time.monotonic() < deadline:
                # As the relay would: a batch given back is claimed again, its first events unchained.
                batch = runs(topic, [("a", 2), ("b", 2)], set())
                try:
                    outcomes = await sink.publish(batch, holds)
                except SinkUnavailable:
                    await asyncio.sleep(0.5)
                    continue
                if outcomes == [None] * len(batch):
                    delivered.extend(batch)
                    return time.monotonic() - restarted
                await asyncio.sleep(0.5)
            raise AssertionError("the sink never delivered again after the broker restarted")
        finally:
            await sink.close()

    recovered_after = asyncio.run(scenario())
    print(f"delivered again {recovered_after:.1f}s after the restart")
    received = consume(tansu.bootstrap, topic, count=len(delivered))
    assert {k: first_copies(v) for k, v in by_key(received).items()} == expected_by_key(delivered)
