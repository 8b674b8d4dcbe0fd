"""The Kafka sink against a real Kafka-protocol broker (Tansu)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from devservers import Tansu, free_port
from relay.config import Format, KafkaSinkConfig
from relay.errors import SinkError, SinkUnavailable
from relay.events import IDEMPOTENCY_HEADER, Event, Outcome
from relay.holds import KeyHolds
from relay.sinks.kafka import KafkaSink
from tests.integration.kafka_support import (
    consume,
    make_event,
    murmur2_partition,
    partition_count,
    running_tansu,
    unique_topic,
)

PUBLISH_TIMEOUT_SECONDS = 3.0
PASSWORD = "hunter2-do-not-log"

pytestmark = pytest.mark.timeout(90)


def make_sink(bootstrap: str, **options: str) -> KafkaSink:
    return KafkaSink(
        KafkaSinkConfig(bootstrap_servers=bootstrap, options=options),
        publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS,
        connect_timeout_seconds=3.0,
    )


async def publish_once(sink: KafkaSink, *batches: list[Event]) -> list[list[Outcome]]:
    """Start, publish the batches concurrently (pipelined), close."""
    await sink.start()
    try:
        return list(await asyncio.gather(*(sink.publish(batch) for batch in batches)))
    finally:
        await sink.close()


def test_messages_carry_the_contract_shape(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    events = [
        make_event(topic, key="order-1", headers={"trace-id": "t-1", "source": "shop"}),
        make_event(topic, key="order-2"),
        make_event(topic, key=None, headers={"only": "header"}),
        make_event(topic, key="order-1", payload='{"name": "Zoë ✓"}'.encode()),
        make_event(topic, key="ключ-3"),
        make_event(topic, key="order-2", headers={"trace-id": "t-2"}),
        make_event(topic, key=None),
        make_event(topic, key="order-1"),
    ]

    [outcomes] = asyncio.run(publish_once(make_sink(kafka_bootstrap), events))

    assert outcomes == [None] * len(events)
    received = consume(kafka_bootstrap, topic, count=len(events))
    assert len(received) == len(events)
    by_idempotency_key = {m.headers[IDEMPOTENCY_HEADER].decode(): m for m in received}
    for event in events:
        message = by_idempotency_key[event.idempotency_key]
        assert message.topic == event.topic
        assert message.key == (None if event.key is None else event.key.encode())
        assert message.value == event.payload
        expected = {k: v.encode() for k, v in event.headers.items()}
        expected[IDEMPOTENCY_HEADER] = event.idempotency_key.encode()
        assert message.headers == expected


def test_keys_keep_their_order_and_java_partition(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    keys = [f"aggregate-{n}" for n in range(7)]
    first = [make_event(topic, key=keys[n % len(keys)]) for n in range(300)]
    second = [make_event(topic, key=keys[n % len(keys)]) for n in range(300)]

    results = asyncio.run(publish_once(make_sink(kafka_bootstrap), first, second))

    assert results == [[None] * 300, [None] * 300]
    received = consume(kafka_bootstrap, topic, count=600)
    assert len(received) == 600
    sent_order = {e.idempotency_key: n for n, e in enumerate(first + second)}
    by_key: dict[bytes | None, list[tuple[int, int, int]]] = defaultdict(list)
    for m in received:
        by_key[m.key].append((m.partition, m.offset, sent_order[m.headers[IDEMPOTENCY_HEADER].decode()]))
    for key, placed in by_key.items():
        assert key is not None
        assert len({partition for partition, _, _ in placed}) == 1, f"{key!r} spread over partitions"
        in_log_order = [sent for _, _, sent in sorted(placed)]
        assert in_log_order == sorted(in_log_order), f"{key!r} reordered"
    # Same key, same partition as a Java client: check against Kafka's own murmur2.
    partitions = partition_count(kafka_bootstrap, topic)
    for key, placed in by_key.items():
        assert key is not None
        assert placed[0][0] == murmur2_partition(key, partitions)


def test_oversized_event_fails_alone_and_permanently(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    events = [make_event(topic, key="k") for _ in range(2)]
    events.append(make_event(topic, key="k", payload=b'"' + b"x" * 5000 + b'"'))
    events += [make_event(topic, key="k") for _ in range(2)]

    [outcomes] = asyncio.run(publish_once(make_sink(kafka_bootstrap, **{"message.max.bytes": "2000"}), events))

    assert outcomes[:2] == [None, None]
    assert outcomes[3:] == [None, None]
    failure = outcomes[2]
    assert failure is not None
    assert failure.permanent
    assert "MSG_SIZE_TOO_LARGE" in failure.error
    assert "xxxx" not in failure.error
    received = consume(kafka_bootstrap, topic, count=4)
    assert sorted(m.value for m in received) == sorted(e.payload for e in events if len(e.payload) < 100)


def test_invalid_topic_fails_that_event_permanently(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    events = [make_event(topic), make_event("not a valid topic!"), make_event(topic)]

    [outcomes] = asyncio.run(publish_once(make_sink(kafka_bootstrap), events))

    assert outcomes[0] is None
    assert outcomes[2] is None
    failure = outcomes[1]
    assert failure is not None
    assert failure.permanent
    assert len(failure.error) <= 200
    assert len(consume(kafka_bootstrap, topic, count=2)) == 2


def test_unreachable_broker_fails_start_quickly_without_leaking_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="relay")
    bootstrap = f"127.0.0.1:{free_port()}"
    sink = make_sink(
        bootstrap,
        **{
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "relay",
            "sasl.password": PASSWORD,
        },
    )
    began = time.monotonic()

    with pytest.raises(SinkUnavailable) as raised:
        asyncio.run(sink.start())

    assert time.monotonic() - began < 10
    assert bootstrap in str(raised.value)
    assert PASSWORD not in str(raised.value)
    assert all(PASSWORD not in record.getMessage() for record in caplog.records)
    asyncio.run(sink.close())
    asyncio.run(sink.close())


def test_broker_going_away_makes_publish_and_check_unavailable(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="relay")
    topic = unique_topic()

    async def scenario(tansu: Tansu) -> None:
        sink = make_sink(tansu.bootstrap)
        await sink.start()
        try:
            assert await sink.publish([make_event(topic, key="k")]) == [None]
            tansu.stop()
            began = time.monotonic()
            with pytest.raises(SinkUnavailable) as raised:
                await sink.publish([make_event(topic, key="k"), make_event(topic)])
            assert time.monotonic() - began < PUBLISH_TIMEOUT_SECONDS + 6
            assert tansu.bootstrap in str(raised.value)
            with pytest.raises(SinkUnavailable):
                await sink.check()
        finally:
            await sink.close()

    with running_tansu() as tansu:
        asyncio.run(scenario(tansu))
    actions = {getattr(record, "action", None) for record in caplog.records}
    assert "kafka_connected" in actions
    assert "kafka_client_error" in actions


def test_check_passes_while_the_broker_answers(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        sink = make_sink(kafka_bootstrap)
        await sink.start()
        try:
            await sink.check()
        finally:
            await sink.close()

    asyncio.run(scenario())


def test_close_is_idempotent_and_final(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        never_started = make_sink(kafka_bootstrap)
        await never_started.close()
        await never_started.close()
        sink = make_sink(kafka_bootstrap)
        await sink.start()
        await sink.close()
        await sink.close()
        with pytest.raises(SinkError):
            await sink.publish([make_event(unique_topic())])
        with pytest.raises(SinkUnavailable):
            await sink.check()

    asyncio.run(scenario())


def test_empty_batch_publishes_nothing(kafka_bootstrap: str) -> None:
    async def scenario() -> None:
        sink = make_sink(kafka_bootstrap)
        await sink.start()
        try:
            assert await sink.publish([]) == []
        finally:
            await sink.close()

    asyncio.run(scenario())


def fatal_error() -> KafkaError:
    return KafkaError(KafkaError._FATAL, "injected by the test", fatal=True)


def test_fatal_error_fails_pending_events_at_once_and_holds_their_keys() -> None:
    holds = KeyHolds()

    async def scenario(tansu: Tansu) -> None:
        sink = make_sink(tansu.bootstrap)
        await sink.start()
        try:
            tansu.stop()  # keeps the batch waiting for acknowledgements
            client = sink._client
            assert client is not None

            async def inject() -> float:
                await asyncio.sleep(0.3)
                client._on_error(fatal_error())
                return time.monotonic()

            events = [make_event(unique_topic(), key=f"k{n}") for n in range(3)]
            results = await asyncio.gather(sink.publish(events, holds), inject(), return_exceptions=True)
            raised, injected_at = results
            assert isinstance(injected_at, float)
            assert time.monotonic() - injected_at < 1.0
            # Not the events' fault, and the broker may have them: nothing spent, all given back.
            assert isinstance(raised, SinkUnavailable), raised
            assert "_FATAL" in str(raised)
            assert all(holds.held(f"k{n}") for n in range(3))
        finally:
            await sink.close()

    with running_tansu() as tansu:
        asyncio.run(scenario(tansu))


def test_fatal_error_rebuilds_the_producer(kafka_bootstrap: str) -> None:
    topic = unique_topic()

    async def scenario() -> None:
        sink = make_sink(kafka_bootstrap)
        await sink.start()
        try:
            assert await sink.publish([make_event(topic)]) == [None]
            broken = sink._client
            assert broken is not None
            broken._on_error(fatal_error())
            assert await sink.publish([make_event(topic), make_event(topic)]) == [None, None]
            assert sink._client is not broken
        finally:
            await sink.close()

    asyncio.run(scenario())
    assert len(consume(kafka_bootstrap, topic, count=3)) == 3


def test_a_full_local_queue_slows_publishing_but_loses_nothing(kafka_bootstrap: str) -> None:
    topic = unique_topic()
    events = [make_event(topic, key=f"k{n % 3}") for n in range(2000)]
    sink = make_sink(kafka_bootstrap, **{"queue.buffering.max.messages": "50"})

    [outcomes] = asyncio.run(publish_once(sink, events))

    assert outcomes == [None] * len(events)
    assert len(consume(kafka_bootstrap, topic, count=len(events))) == len(events)


NUL_CARRIED: dict[str, dict[str, Any]] = {
    "header value": {"headers": {"trace": "a\x00b", "plain": "p"}},
    "header value that is only a NUL": {"headers": {"h": "\x00"}},
    "idempotency key": {"idempotency_key": "idem\x00tail"},
    "content type": {"content_type": "text/plain\x00; x=y", "payload": b"raw"},
    "key": {"key": "k\x00ey"},
}


@pytest.mark.parametrize("chosen", [Format.NATIVE, Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED])
def test_nul_characters_in_headers_arrive_whole_or_the_event_is_refused_alone(
    kafka_bootstrap: str, chosen: Format
) -> None:
    """Plain SQL on MySQL can write NUL characters (JSON \\u0000) into headers and the text columns.

    The client cut header names and string values at the NUL without a word:
    values now go as bytes and arrive whole; a name with a NUL is refused for
    good, holding its key's later events, while everything else arrives."""
    topic = unique_topic("nul")
    carried = [
        replace(make_event(topic, key=fields.get("key", f"carried-{n}")), **fields)
        for n, fields in enumerate(NUL_CARRIED.values())
    ]
    refused = [
        replace(make_event(topic, key="bad-name", headers={"a\x00b": "v"})),
        replace(make_event(topic, key="bad-name"), chained=True),
        make_event(topic, key=None, headers={"ok": "1", "\x00": "only a NUL"}),
    ]
    after = make_event(topic, key=None, headers={"after": "yes"})
    sink = KafkaSink(
        KafkaSinkConfig(bootstrap_servers=kafka_bootstrap, options={}, format=chosen),
        publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS,
        connect_timeout_seconds=3.0,
    )

    async def go() -> list[Outcome]:
        await sink.start()
        try:
            return await sink.publish([*carried, *refused, after], KeyHolds())
        finally:
            await sink.close()

    outcomes = asyncio.run(go())

    # CloudEvents attributes (id, datacontenttype, partitionkey) may hold no control character: those
    # events are refused for good in the CloudEvents formats; header values are no attributes.
    attribute_borne = {"idempotency key", "content type", "key"} if chosen is not Format.NATIVE else set()
    for name, outcome in zip(NUL_CARRIED, outcomes, strict=False):
        if name in attribute_borne:
            assert outcome is not None and outcome.permanent and "CloudEvents attribute" in outcome.error, name
        else:
            assert outcome is None, name
    carried = [e for name, e in zip(NUL_CARRIED, carried, strict=True) if name not in attribute_borne]
    name_refused, held, nul_only_name, delivered = outcomes[len(NUL_CARRIED) :]
    for failure in (name_refused, nul_only_name):
        assert failure is not None and failure.permanent and "contains a NUL character" in failure.error
    assert held is not None and held.held
    assert delivered is None
    received = consume(kafka_bootstrap, topic, count=len(carried) + 1)
    assert len(received) == len(carried) + 1
    by_key = {m.key: m for m in received}
    for event in carried:
        message = by_key[event.key.encode() if event.key else None]
        if chosen is Format.CLOUDEVENTS_STRUCTURED:
            envelope = json.loads(message.value)
            assert envelope["id"] == event.idempotency_key
        else:
            assert message.value == event.payload
        assert message.headers[IDEMPOTENCY_HEADER] == event.idempotency_key.encode()
        for name, value in event.headers.items():
            assert message.headers[name] == value.encode()
        if event.content_type is not None and chosen is not Format.CLOUDEVENTS_STRUCTURED:
            assert message.headers["content-type"] == event.content_type.encode()
