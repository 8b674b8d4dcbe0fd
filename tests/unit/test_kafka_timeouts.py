"""The Kafka sink tells timeouts (the broker may have the events) from an unreachable cluster.

librdkafka is replaced by a scripted producer that reports each message as the
test says: acknowledged, timed out, a transport error, or never.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError

from relay.config import KafkaSinkConfig
from relay.errors import SinkTimeout, SinkUnavailable
from relay.events import Failure, Outcome
from relay.sinks.kafka import client as kafka_client
from relay.sinks.kafka import sink as kafka_sink
from relay.sinks.kafka.sink import KafkaSink
from tests.integration.kafka_support import make_event

ACK, NEVER = "ack", "never"
TIMED_OUT = KafkaError._MSG_TIMED_OUT
TRANSPORT = KafkaError._TRANSPORT


class ScriptedProducer:
    """Stands in for ``confluent_kafka.Producer``: each message's report comes from ``script``.

    ``script[topic]`` is ``ack``, ``never`` or a ``KafkaError`` code; ``cluster_errors``
    are sent to the error callback, as librdkafka does when brokers go away.
    """

    script: dict[str, str | int] = {}
    cluster_errors: list[int] = []

    def __init__(self, settings: dict[str, Any]) -> None:
        self._on_error: Callable[[KafkaError], None] = settings["error_cb"]
        self._reports: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def produce(self, topic: str, value: bytes, key: object, *, on_delivery: Any, headers: object) -> None:
        outcome = self.script[topic]
        if outcome == NEVER:
            return
        error = None if isinstance(outcome, str) else KafkaError(outcome)
        with self._lock:
            self._reports.append(lambda: on_delivery(error, None))

    def poll(self, timeout: float) -> int:
        for code in self.cluster_errors:
            self._on_error(KafkaError(code))
        with self._lock:
            reports, self._reports = self._reports, []
        for report in reports:
            report()
        threading.Event().wait(min(timeout, 0.01))
        return len(reports)

    def list_topics(self, timeout: float) -> object:
        return object()

    def flush(self, timeout: float) -> int:
        return 0

    def purge(self, **_: bool) -> None:
        self._reports.clear()

    def close(self) -> None:
        pass


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[ScriptedProducer]:
    monkeypatch.setattr(kafka_client, "Producer", ScriptedProducer)
    monkeypatch.setattr(kafka_sink, "WAIT_MARGIN_SECONDS", 0.2)
    monkeypatch.setattr(ScriptedProducer, "script", {})
    monkeypatch.setattr(ScriptedProducer, "cluster_errors", [])
    return ScriptedProducer


def publish(script: dict[str, str | int], topics: list[str]) -> list[Outcome]:
    ScriptedProducer.script.update(script)

    async def scenario() -> list[Outcome]:
        sink = KafkaSink(KafkaSinkConfig("broker:9092"), publish_timeout_seconds=0.3)
        await sink.start()
        try:
            return await sink.publish([make_event(topic) for topic in topics])
        finally:
            await sink.close()

    return asyncio.run(scenario())


@pytest.mark.usefixtures("scripted")
@pytest.mark.parametrize("script", [{"t": TIMED_OUT}, {"t": NEVER}, {"t": TIMED_OUT, "u": NEVER}])
def test_a_batch_that_only_timed_out_raises_sink_timeout(script: dict[str, str | int]) -> None:
    with pytest.raises(SinkTimeout):
        publish(script, [*script] * 3)


@pytest.mark.usefixtures("scripted")
def test_a_batch_that_could_not_reach_the_cluster_is_unavailable_not_a_timeout() -> None:
    with pytest.raises(SinkUnavailable) as caught:
        publish({"t": TRANSPORT}, ["t", "t"])
    assert not isinstance(caught.value, SinkTimeout)


def test_timeouts_while_the_brokers_are_down_are_unavailable(scripted: type[ScriptedProducer]) -> None:
    scripted.cluster_errors.append(KafkaError._ALL_BROKERS_DOWN)
    with pytest.raises(SinkUnavailable) as caught:
        publish({"t": TIMED_OUT}, ["t", "t"])
    assert not isinstance(caught.value, SinkTimeout)


@pytest.mark.usefixtures("scripted")
@pytest.mark.parametrize("lost", [TIMED_OUT, NEVER])
def test_timeouts_beside_acknowledged_events_are_timed_out_failures(lost: str | int) -> None:
    outcomes = publish({"ok": ACK, "lost": lost, "bad": TRANSPORT}, ["ok", "lost", "ok", "bad"])
    assert outcomes[0] is None and outcomes[2] is None
    timed_out, transport = outcomes[1], outcomes[3]
    assert isinstance(timed_out, Failure) and timed_out.timed_out and not timed_out.permanent, timed_out
    assert isinstance(transport, Failure) and not transport.timed_out, transport
