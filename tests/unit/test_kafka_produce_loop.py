"""The Kafka sink's produce loop and delivery reports, with librdkafka replaced by a recorder.

The loop checks each event inline and only where a check can matter (a
topic's refusal once per call, the headers' NULs in place, the holds for keyed
events); these tests pin that every event still gets its own answer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from relay.config import KafkaSinkConfig
from relay.events import EMPTY_TOPIC, Failure
from relay.holds import KeyHolds
from relay.sinks.kafka import client as kafka_client
from relay.sinks.kafka.batch import Batch
from relay.sinks.kafka.sink import KafkaSink
from tests.integration.kafka_support import make_event


class Recorder:
    """Stands in for ``confluent_kafka.Producer``: acknowledges every message at the next poll or flush."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.sent: list[tuple[str, str | None, list[tuple[str, Any]]]] = []
        self._reports: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def produce(self, topic: str, value: bytes, key: str | None, *, on_delivery: Any, headers: Any) -> None:
        with self._lock:
            self.sent.append((topic, key, headers))
            self._reports.append(lambda: on_delivery(None, None))

    def poll(self, timeout: float) -> int:
        with self._lock:
            reports, self._reports = self._reports, []
        for report in reports:
            report()
        threading.Event().wait(min(timeout, 0.01))
        return len(reports)

    def flush(self, timeout: float) -> int:
        return 0

    def list_topics(self, timeout: float) -> object:
        return object()

    def purge(self, **flags: bool) -> None:
        self._reports.clear()

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def recorder(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(kafka_client, "Producer", Recorder)
    yield


def publish(events: list[Any], holds: KeyHolds | None = None) -> tuple[list[Any], Recorder]:
    async def go() -> tuple[list[Any], Recorder]:
        sink = KafkaSink(KafkaSinkConfig("broker:9092"), publish_timeout_seconds=5.0)
        await sink.start()
        assert sink._client is not None
        producer = sink._client.producer
        assert isinstance(producer, Recorder)
        try:
            return await sink.publish(events, holds), producer
        finally:
            await sink.close()

    return asyncio.run(go())


@pytest.mark.timeout(20)
@pytest.mark.parametrize("holds", [None, KeyHolds()], ids=["without holds", "with holds"])
def test_each_event_of_a_refused_topic_is_refused_and_the_others_go(holds: KeyHolds | None) -> None:
    events = [
        make_event("bad\x00topic", key="a"),
        make_event("good", key="b"),
        make_event("bad\x00topic", key="c"),
        make_event("", key="d"),
        make_event("good", key=None, headers={"x": "1"}),
        make_event("", key=None),
    ]
    outcomes, producer = publish(events, holds)
    for index in (0, 2):
        failure = outcomes[index]
        assert failure is not None and failure.permanent and "NUL" in failure.error
    for index in (3, 5):
        assert outcomes[index] == Failure(EMPTY_TOPIC, permanent=True)
    assert outcomes[1] is None and outcomes[4] is None
    assert [(topic, key) for topic, key, _ in producer.sent] == [("good", "b"), ("good", None)]


@pytest.mark.timeout(20)
def test_a_nul_in_any_header_value_goes_as_bytes_and_in_a_name_refuses_its_event() -> None:
    events = [
        make_event("t", key="a", headers={"first": "1", "second": "x\x00y"}),
        make_event("t", key="b", headers={"ok": "1", "bad\x00name": "v"}),
        replace(make_event("t", key="c"), idempotency_key="id\x00tail"),
        make_event("t", key="d", headers={"plain": "v"}),
    ]
    outcomes, producer = publish(events, KeyHolds())
    assert outcomes[0] is None and outcomes[2] is None and outcomes[3] is None
    assert outcomes[1] is not None and outcomes[1].permanent and "NUL" in outcomes[1].error
    sent = {key: dict(headers) for _, key, headers in producer.sent}
    assert list(sent) == ["a", "c", "d"]
    assert sent["a"]["second"] == b"x\x00y" and sent["a"]["first"] == "1"
    assert sent["c"]["idempotency-key"] == b"id\x00tail"
    assert sent["d"] == {"plain": "v", "idempotency-key": events[3].idempotency_key}


@pytest.mark.timeout(20)
def test_a_held_key_and_a_chained_event_on_another_topic_are_held_the_rest_goes() -> None:
    holds = KeyHolds()
    held = make_event("t", key="held")
    holds.hold([held])
    events = [
        replace(make_event("t", key="held"), chained=True),
        make_event("t", key="k"),
        replace(make_event("other", key="k"), chained=True),  # its predecessor went to another topic
        replace(make_event("t", key="k"), chained=True),
        make_event("t", key="fresh"),
    ]
    outcomes, producer = publish(events, holds)
    assert [o is not None and o.held for o in outcomes] == [True, False, True, True, False]
    assert [key for _, key, _ in producer.sent] == ["k", "fresh"]
    assert holds.held("held") and holds.held("k") and not holds.held("fresh")


def test_an_acknowledgement_counts_once_and_a_failed_report_goes_to_the_clients_check() -> None:
    failed: list[tuple[int, int]] = []

    async def scenario() -> None:
        batch = Batch(
            [make_event("t", key="a") for _ in range(3)],
            asyncio.get_running_loop(),
            KeyHolds(),
            lambda b, index, error, message: failed.append((index, error.code())),
        )
        batch.delivered(0, None, None)
        batch.delivered(0, None, None)  # a second report of one message changes nothing
        batch.delivered(1, KafkaError(KafkaError._PURGE_QUEUE), None)
        assert failed == [(1, KafkaError._PURGE_QUEUE)]
        assert (batch.acked, batch.finished) == (1, False)
        outcomes = batch.close()
        batch.delivered(2, None, None)  # too late: its outcome was given as not acknowledged
        assert outcomes[0] is None and outcomes[1] is not None and outcomes[2] is not None
        assert batch.acked == 1

    asyncio.run(scenario())


def test_without_a_clients_check_a_failed_report_is_recorded_by_the_batch() -> None:
    async def scenario() -> None:
        holds = KeyHolds()
        batch = Batch([make_event("t", key="a"), make_event("t", key="b")], asyncio.get_running_loop(), holds)
        batch.delivered(0, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)
        batch.delivered(1, None, None)
        await asyncio.wait_for(batch.future, 1)
        outcomes = batch.close()
        assert outcomes[0] is not None and outcomes[0].permanent and outcomes[1] is None
        assert holds.held("a") and not holds.held("b")

    asyncio.run(scenario())
