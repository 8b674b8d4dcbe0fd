"""The Kafka sink retires a producer that can no longer keep a key's order, and a new one takes over.

librdkafka is replaced by a stand-in: messages to topic ``ack`` are
acknowledged at the next poll, those to ``never`` (or with the value
``NEVER_PAYLOAD``) never are, those to ``fail``
get a (non-fatal) error report; ``next_fatal_from`` makes ``poll`` or ``flush``
raise a fatal ``KafkaException``, as confluent-kafka does without calling
``error_cb``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

from relay.config import KafkaSinkConfig
from relay.errors import SinkUnavailable
from relay.events import HELD, Event
from relay.holds import KeyHolds
from relay.sinks.kafka import client as kafka_client
from relay.sinks.kafka.sink import KafkaSink
from tests.integration.kafka_support import make_event

#: A message with this value is never acknowledged, whatever its topic.
NEVER_PAYLOAD = b'"never"'
FATAL = KafkaError(KafkaError._GAPLESS_GUARANTEE, "gap-less ordering would not be guaranteed", fatal=True)


class StandIn:
    """Stands in for ``confluent_kafka.Producer``."""

    made: ClassVar[list[StandIn]] = []
    #: "poll" or "flush": once armed, the next such call of the next producer made raises ``FATAL``.
    next_fatal_from: ClassVar[str | None] = None

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.fatal_from, StandIn.next_fatal_from = StandIn.next_fatal_from, None
        self.armed = threading.Event()
        self.reports: list[Callable[[], None]] = []
        self.lock = threading.Lock()
        self.purged: list[dict[str, bool]] = []
        self.closed = False
        self.made.append(self)

    def produce(self, topic: str, value: bytes, key: object, *, on_delivery: Any, headers: object) -> None:
        if topic == "never" or value == NEVER_PAYLOAD:
            return
        error = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND) if topic == "fail" else None
        with self.lock:
            self.reports.append(lambda: on_delivery(error, None))

    def _maybe_raise(self, call: str) -> None:
        if self.fatal_from == call and self.armed.is_set():
            self.armed.clear()
            raise KafkaException(FATAL)

    def poll(self, timeout: float) -> int:
        self._maybe_raise("poll")
        with self.lock:
            reports, self.reports = self.reports, []
        for report in reports:
            report()
        threading.Event().wait(min(timeout, 0.01))
        return len(reports)

    def flush(self, timeout: float) -> int:
        self._maybe_raise("flush")
        return 0

    def list_topics(self, timeout: float) -> object:
        return object()

    def purge(self, **flags: bool) -> None:
        self.purged.append(flags)
        with self.lock:
            self.reports.clear()

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[StandIn]]:
    monkeypatch.setattr(kafka_client, "Producer", StandIn)
    monkeypatch.setattr(StandIn, "made", [])
    monkeypatch.setattr(StandIn, "next_fatal_from", None)
    yield StandIn


async def closed(producer: StandIn) -> None:
    """Wait for the retired ``producer`` to be purged and closed (on its own thread)."""
    for _ in range(200):
        if producer.closed:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the retired producer was not closed")


def chained_run(topic: str, key: str, count: int, *, first_chained: bool = False) -> list[Event]:
    return [replace(make_event(topic, key=key), chained=first_chained or n > 0) for n in range(count)]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("call", ["poll", "flush"])
def test_a_fatal_error_raised_by_the_producer_retires_it(call: str) -> None:
    StandIn.next_fatal_from = call
    holds = KeyHolds()
    publish_timeout = 5.0

    async def scenario() -> None:
        sink = KafkaSink(KafkaSinkConfig("broker:9092"), publish_timeout_seconds=publish_timeout)
        await sink.start()
        try:
            [old] = StandIn.made
            first = chained_run("never", "a", 3) + chained_run("ack", "b", 1)
            second = chained_run("never", "a", 2, first_chained=True) + chained_run("never", "c", 1)

            async def arm() -> None:
                await asyncio.sleep(0.2)
                old.armed.set()
                if call == "flush":  # flush runs after a batch is enqueued
                    await sink.publish(chained_run("never", "d", 1), holds)

            began = time.monotonic()
            results = await asyncio.gather(
                sink.publish(first, holds), sink.publish(second, holds), arm(), return_exceptions=True
            )
            assert time.monotonic() - began < publish_timeout / 2, "pending batches waited for the deadline"
            one, two = results[0], results[1]
            # b was acknowledged before the fatal error; the rest may be on the broker: nothing spent.
            assert isinstance(one, list), one
            assert one[3] is None
            assert all(o is not None and o.timed_out and "_GAPLESS_GUARANTEE" in o.error for o in one[:3])
            assert isinstance(two, SinkUnavailable), two
            assert holds.held("a") and holds.held("c") and not holds.held("b")
            # The next batch goes to a new producer; a chained event of a held key is not tried.
            outcomes = await sink.publish(
                [*chained_run("ack", "a", 2), replace(make_event("ack", key="c"), chained=True)], holds
            )
            assert outcomes == [None, None, HELD]
            assert len(StandIn.made) == 2
            assert StandIn.made[1].settings["message.timeout.ms"] == 0
            assert StandIn.made[1].settings["enable.gapless.guarantee"] is True
            await closed(old)
            assert old.purged and old.purged[0]["in_queue"] and old.purged[0]["in_flight"]
        finally:
            await sink.close()

    asyncio.run(scenario())


@pytest.mark.timeout(20)
def test_a_passed_deadline_purges_every_batch_on_the_producer() -> None:
    holds = KeyHolds()

    async def scenario() -> None:
        sink = KafkaSink(KafkaSinkConfig("broker:9092"), publish_timeout_seconds=0.5)
        await sink.start()
        try:
            [old] = StandIn.made
            first = [
                *chained_run("ack", "a", 2),
                replace(make_event("ack", key="a", payload=NEVER_PAYLOAD), chained=True),
            ]
            later = chained_run("ack", "b", 1)  # acknowledged: not held
            queued = chained_run("never", "c", 1)
            one, two, three = await asyncio.gather(
                sink.publish(first, holds),
                sink.publish(later, holds),
                sink.publish(queued, holds),
                return_exceptions=True,
            )
            assert isinstance(one, list) and one[:2] == [None, None]
            assert one[2] is not None and one[2].timed_out
            assert two == [None]
            assert isinstance(three, SinkUnavailable)
            assert holds.held("a") and holds.held("c") and not holds.held("b")
            await closed(old)
            assert old.purged
            assert await sink.publish(chained_run("ack", "c", 1), holds) == [None]
            assert len(StandIn.made) == 2
        finally:
            await sink.close()

    asyncio.run(scenario())


@pytest.mark.timeout(20)
def test_a_failed_delivery_report_holds_its_key_before_the_batch_ends() -> None:
    holds = KeyHolds()

    async def scenario() -> None:
        sink = KafkaSink(KafkaSinkConfig("broker:9092"), publish_timeout_seconds=3.0)
        await sink.start()
        try:
            batch = [*chained_run("fail", "k", 1), *chained_run("never", "x", 1)]
            task = asyncio.create_task(sink.publish(batch, holds))
            for _ in range(100):
                if holds.held("k"):
                    break
                await asyncio.sleep(0.01)
            assert holds.held("k") and not task.done()
            task.cancel()
        finally:
            await sink.close()

    asyncio.run(scenario())


@pytest.mark.timeout(20)
def test_a_chained_event_for_another_topic_is_held() -> None:
    """Kafka orders a key only within a partition: a chained event may not change topic."""
    holds = KeyHolds()

    async def scenario() -> None:
        sink = KafkaSink(KafkaSinkConfig("broker:9092"), publish_timeout_seconds=3.0)
        await sink.start()
        try:
            first = chained_run("ack", "k", 2)
            switched = [
                replace(make_event("ack-2", key="k"), chained=True),
                *chained_run("ack", "k", 1, first_chained=True),
            ]
            # Never seen by this sink (another route's, say): its predecessor's place is unknown.
            unseen = chained_run("ack", "u", 1, first_chained=True)
            assert await sink.publish(first + switched + unseen, holds) == [None, None, HELD, HELD, HELD]
            assert holds.held("k") and holds.held("u")
            # Claimed again once settled, not chained: it goes, and starts its key afresh.
            assert await sink.publish(
                [make_event("ack-2", key="k"), *chained_run("ack-2", "k", 1, first_chained=True)], holds
            ) == [None, None]
        finally:
            await sink.close()

    asyncio.run(scenario())
