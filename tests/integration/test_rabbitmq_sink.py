"""The RabbitMQ sink against the local RabbitMQ server."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

import pytest

from devservers import free_port
from relay.config import AmqpSinkConfig, Format, parse_sink_url
from relay.errors import ConfigError, SinkError, SinkUnavailable
from relay.events import HELD, IDEMPOTENCY_HEADER, Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.sinks.rabbitmq import CORK_MAX_BYTES, MAX_MESSAGE_BYTES, RabbitMQSink
from relay.sinks.rabbitmq.transport import CorkedConnection
from tests.integration.kafka_support import make_event
from tests.integration.rabbit_support import (
    Message,
    TcpProxy,
    temp_exchange,
    temp_queue,
    unique_name,
    via_proxy,
)

PUBLISH_TIMEOUT_SECONDS = 5.0
PASSWORD = "hunter2-do-not-log"

pytestmark = pytest.mark.timeout(60)


def make_sink(
    amqp_url: str,
    exchange: str = "",
    *,
    publish_timeout_seconds: float = PUBLISH_TIMEOUT_SECONDS,
    connect_timeout_seconds: float = 3.0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> RabbitMQSink:
    return RabbitMQSink(
        AmqpSinkConfig(url=amqp_url, exchange=exchange),
        publish_timeout_seconds=publish_timeout_seconds,
        connect_timeout_seconds=connect_timeout_seconds,
        max_message_bytes=max_message_bytes,
    )


def run_events(topics: list[str], keys: list[str | None]) -> list[Event]:
    """Events as a claim hands out runs: each one after the first of its key is ``chained``."""
    seen: set[str] = set()
    events = []
    for topic, key in zip(topics, keys, strict=True):
        events.append(replace(make_event(topic, key=key), chained=key in seen))
        if key is not None:
            seen.add(key)
    return events


async def publish_once(sink: RabbitMQSink, *batches: list[Event]) -> list[list[Outcome]]:
    """Start, publish the batches concurrently (pipelined), close."""
    await sink.start()
    try:
        return list(await asyncio.gather(*(sink.publish(batch) for batch in batches)))
    finally:
        await sink.close()


def with_password(amqp_url: str, password: str) -> str:
    parts = urlsplit(amqp_url)
    user = (parts.username or "guest").split(":")[0]
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def assert_contract_shape(message: Message, event: Event, exchange: str) -> None:
    assert message.exchange == exchange
    assert message.routing_key == event.topic
    assert message.body == event.payload
    assert message.content_type == "application/json"
    assert message.delivery_mode == 2
    assert message.message_id == event.idempotency_key
    assert message.headers == {**event.headers, IDEMPOTENCY_HEADER: event.idempotency_key}


def test_messages_carry_the_contract_shape_on_the_default_exchange(amqp_url: str) -> None:
    with temp_queue(amqp_url) as queue:
        events = [
            make_event(queue.name, key="order-1", headers={"trace-id": "t-1", "source": "shop"}),
            make_event(queue.name, key="order-2"),
            make_event(queue.name, key=None, headers={"only": "header"}),
            make_event(queue.name, key="order-1", payload=json.dumps({"name": "Zoë ✓"}).encode()),
            make_event(queue.name, key="order-1", headers={"trace-id": "t-2"}),
        ]

        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url), events))

        assert outcomes == [None] * len(events)
        received = queue.collect(len(events))
        assert len(received) == len(events)
        # One queue, one channel: the queue holds them in publish order.
        for message, event in zip(received, events, strict=True):
            assert_contract_shape(message, event, exchange="")


def test_named_exchange_routes_by_topic_and_keeps_order(amqp_url: str) -> None:
    orders, payments = unique_name("orders"), unique_name("payments")
    with (
        temp_exchange(amqp_url) as exchange,
        temp_queue(amqp_url, exchange=exchange, routing_keys=[orders]) as orders_queue,
        temp_queue(amqp_url, exchange=exchange, routing_keys=[payments]) as payments_queue,
    ):
        # Two pipelined batches with keys of their own, as the relay claims them
        # (RabbitMQ does not chain keys across batches); each key's run crosses topics.
        first = run_events([orders if i % 3 else payments for i in range(300)], keys=[f"a{i % 4}" for i in range(300)])
        second = run_events([orders if i % 2 else payments for i in range(300)], keys=[f"b{i % 4}" for i in range(300)])

        outcomes = asyncio.run(publish_once(make_sink(amqp_url, exchange), first, second))

        assert outcomes == [[None] * 300, [None] * 300]
        events = first + second
        by_id = {e.idempotency_key: e for e in events}
        for queue, topic in ((orders_queue, orders), (payments_queue, payments)):
            expected = [e for e in events if e.topic == topic]
            received = queue.collect(len(expected))
            assert sorted(m.message_id or "" for m in received) == sorted(e.idempotency_key for e in expected)
            # Every key's events arrive in the order they were given.
            for key in {e.key for e in expected}:
                got = [m.message_id for m in received if by_id[m.message_id or ""].key == key]
                assert got == [e.idempotency_key for e in expected if e.key == key]
            for message in received:
                assert_contract_shape(message, by_id[message.message_id or ""], exchange=exchange)


def test_a_batch_leaves_in_a_few_writes_rather_than_three_per_message(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    write = CorkedConnection._emit

    def counted(connection: CorkedConnection, data: bytes) -> None:
        writes.append(len(data))
        write(connection, data)

    monkeypatch.setattr(CorkedConnection, "_emit", counted)
    with temp_queue(amqp_url) as queue:
        # One event per key (the common case): all of them go at once.
        events = [make_event(queue.name, key=f"k{i}") for i in range(300)]

        async def publish() -> tuple[list[Outcome], int]:
            sink = make_sink(amqp_url)
            await sink.start()
            try:
                writes.clear()
                outcomes = await sink.publish(events)
                return outcomes, len(writes)
            finally:
                await sink.close()

        outcomes, during_publish = asyncio.run(publish())
        assert outcomes == [None] * 300
        # 300 messages are 900 frames; pika would hand each to the socket alone.
        assert during_publish == 1
        received = queue.collect(300)
        assert [m.message_id for m in received] == [e.idempotency_key for e in events]

        # Big messages are written every CORK_MAX_BYTES rather than joined into one copy.
        payload = json.dumps({"blob": "x" * 100_000}).encode()
        events = [make_event(queue.name, payload=payload) for _ in range(10)]
        outcomes, during_publish = asyncio.run(publish())
        assert outcomes == [None] * 10
        assert 10 * len(payload) // CORK_MAX_BYTES <= during_publish < 30
        received = queue.collect(10)
        assert [m.message_id for m in received] == [e.idempotency_key for e in events]


def test_an_unroutable_event_fails_alone_and_holds_the_rest_of_its_key(amqp_url: str) -> None:
    nowhere = unique_name("nowhere")
    with temp_queue(amqp_url) as queue:
        events = run_events([queue.name, nowhere, queue.name, nowhere, queue.name], keys=["a", "a", "b", "c", "a"])
        holds = KeyHolds()

        async def scenario() -> list[Outcome]:
            sink = make_sink(amqp_url)
            await sink.start()
            try:
                return await sink.publish(events, holds)
            finally:
                await sink.close()

        outcomes = asyncio.run(scenario())

        assert [o is None for o in outcomes] == [True, False, True, False, False]
        for outcome in (outcomes[1], outcomes[3]):
            assert isinstance(outcome, Failure)
            assert outcome.error.startswith("unroutable: no queue bound for routing key")
            assert nowhere in outcome.error
            assert not outcome.permanent
        # The returned message is never overtaken by a later one of its key.
        assert outcomes[4] == HELD
        assert holds.held("a") and holds.held("c") and not holds.held("b")
        received = queue.collect(2)
        assert [m.message_id for m in received] == [events[i].idempotency_key for i in (0, 2)]


def test_unroutable_on_a_named_exchange(amqp_url: str) -> None:
    bound, unbound = unique_name("bound"), unique_name("unbound")
    with (
        temp_exchange(amqp_url) as exchange,
        temp_queue(amqp_url, exchange=exchange, routing_keys=[bound]) as queue,
    ):
        events = [make_event(bound), make_event(unbound), make_event(bound)]

        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url, exchange), events))

        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], Failure) and "unroutable" in outcomes[1].error
        assert len(queue.collect(2)) == 2


def test_a_nack_is_a_transient_failure_for_that_event_only(amqp_url: str) -> None:
    # A full queue with overflow=reject-publish makes RabbitMQ nack the rest.
    full = {"x-max-length": 2, "x-overflow": "reject-publish"}
    with temp_queue(amqp_url, arguments=full) as queue:
        events = [make_event(queue.name) for _ in range(4)]

        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url), events))

        assert outcomes[:2] == [None, None]
        for outcome in outcomes[2:]:
            assert isinstance(outcome, Failure) and not outcome.permanent
            assert "nacked" in outcome.error
        assert [m.message_id for m in queue.collect(2)] == [e.idempotency_key for e in events[:2]]


def test_reserved_headers_are_refused_and_never_forwarded(amqp_url: str) -> None:
    with temp_queue(amqp_url) as queue:
        reserved = ["CC", "BCC", "x-death", "x-received-from", "x-delivery-count", "x-last-death-reason"]
        events = [make_event(queue.name, headers={name: "v", "ok": "1"}) for name in reserved]
        # Application headers, x-* included, are forwarded as they are; names match exactly, as in RabbitMQ.
        fine = make_event(queue.name, headers={"cc": "a", "Bcc": "b", "X-Request-ID": "r", "x-match": "any"})

        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url), [*events, fine]))

        for name, outcome in zip(reserved, outcomes, strict=False):
            assert isinstance(outcome, Failure)
            assert outcome.permanent
            assert repr(name) in outcome.error
        assert outcomes[-1] is None
        received = queue.collect(1)
        assert [m.message_id for m in received] == [fine.idempotency_key]
        assert received[0].headers == {**fine.headers, IDEMPOTENCY_HEADER: fine.idempotency_key}


def test_a_batch_of_only_refused_events_needs_no_broker() -> None:
    sink = make_sink(f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F")
    events = [make_event("t", headers={"CC": "x"}), make_event("t" * 256)]

    outcomes = asyncio.run(sink.publish(events))

    assert all(isinstance(o, Failure) and o.permanent for o in outcomes)
    asyncio.run(sink.close())


def test_oversized_payloads_are_refused_up_front(amqp_url: str) -> None:
    with temp_queue(amqp_url) as queue:
        small, large = make_event(queue.name, payload=b'"x"'), make_event(queue.name, payload=b'"' + b"y" * 200 + b'"')

        sink = make_sink(amqp_url, max_message_bytes=100)
        [outcomes] = asyncio.run(publish_once(sink, [small, large, small]))

        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], Failure) and outcomes[1].permanent
        assert "202 bytes is larger than" in outcomes[1].error
        assert len(queue.collect(2)) == 2


@pytest.mark.parametrize("chosen", [Format.CLOUDEVENTS_STRUCTURED, Format.CLOUDEVENTS, Format.NATIVE])
def test_a_body_over_the_limit_in_the_sink_s_format_is_refused_up_front(amqp_url: str, chosen: Format) -> None:
    """The structured envelope carries bytes in base64 and adds its attributes: the body, not the payload,
    is what the broker measures. The other formats send the payload as the body."""
    limit = 2000
    bytes_payload = replace(make_event("t", payload=b"\x07" * 1600), content_type="application/octet-stream")
    near_json = make_event("t", payload=b'"' + b"y" * (limit - 100) + b'"')
    small = make_event("t", payload=b'{"fits": true}')
    with temp_queue(amqp_url) as queue:
        events = [replace(e, topic=queue.name) for e in (bytes_payload, near_json, small)]
        sink = RabbitMQSink(
            AmqpSinkConfig(url=amqp_url, format=chosen), publish_timeout_seconds=5.0, max_message_bytes=limit
        )
        [outcomes] = asyncio.run(publish_once(sink, events))
        structured = chosen is Format.CLOUDEVENTS_STRUCTURED
        for outcome in outcomes[:2]:
            if structured:
                assert isinstance(outcome, Failure) and outcome.permanent, outcomes
                assert "message body" in outcome.error and "larger than the broker's max" in outcome.error
            else:
                assert outcome is None, outcomes
        assert outcomes[2] is None
        assert len(queue.collect(1 if structured else 3)) == (1 if structured else 3)


def test_a_body_over_the_broker_limit_fails_alone_and_the_channel_recovers(amqp_url: str) -> None:
    # The sink is told a higher limit than RabbitMQ's default, so the broker
    # closes the channel; the sink must blame the right event and carry on.
    with temp_queue(amqp_url) as queue:
        too_big = make_event(queue.name, payload=b"0" * (MAX_MESSAGE_BYTES + 1))
        before, after = make_event(queue.name), make_event(queue.name)
        sink = make_sink(amqp_url, max_message_bytes=4 * MAX_MESSAGE_BYTES, publish_timeout_seconds=20)

        async def scenario() -> tuple[list[Outcome], list[Outcome], list[Outcome]]:
            await sink.start()
            try:
                first = await sink.publish([before, too_big, after])
                second = await sink.publish([after])
                third = await sink.publish([too_big])  # now refused without a round trip
                return first, second, third
            finally:
                await sink.close()

        first, second, third = asyncio.run(scenario())

        rejected = first[1]
        assert isinstance(rejected, Failure) and rejected.permanent, first
        assert "larger than the broker's max message size" in rejected.error
        assert first[2] is None or not first[2].permanent
        assert second == [None]
        assert isinstance(third[0], Failure) and third[0].permanent
        assert all(len(m.body) < 1000 for m in queue.collect(2))


def test_nothing_listening_is_unavailable_quickly() -> None:
    url = f"amqp://guest:{PASSWORD}@127.0.0.1:{free_port()}/%2F"
    sink = make_sink(url)
    started = time.monotonic()

    with pytest.raises(SinkUnavailable) as excinfo:
        asyncio.run(sink.start())

    assert time.monotonic() - started < 3
    message = str(excinfo.value)
    assert "cannot reach RabbitMQ at amqp://guest:***@127.0.0.1:" in message
    assert PASSWORD not in message
    with pytest.raises(SinkUnavailable):
        asyncio.run(sink.publish([make_event("t")]))
    asyncio.run(sink.close())


def test_a_server_that_never_answers_times_out() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        sink = make_sink(f"amqp://guest:guest@127.0.0.1:{port}/%2F", connect_timeout_seconds=1.0)
        started = time.monotonic()

        with pytest.raises(SinkUnavailable):
            asyncio.run(sink.start())

        assert time.monotonic() - started < 3


def test_a_wrong_password_is_a_clear_error_that_never_shows_it(amqp_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sink = make_sink(with_password(amqp_url, PASSWORD))

    with pytest.raises(SinkError) as excinfo:
        asyncio.run(sink.start())

    assert not isinstance(excinfo.value, SinkUnavailable)
    assert "refused the login" in str(excinfo.value)
    assert PASSWORD not in str(excinfo.value)
    assert caplog.records, "expected pika and the sink to log the attempt"
    assert not [r for r in caplog.records if PASSWORD in r.getMessage()]
    # Later in the relay's life the same problem is retried, not fatal.
    with pytest.raises(SinkUnavailable, match="refused the login"):
        asyncio.run(sink.check())


def test_a_missing_exchange_is_a_clear_error(amqp_url: str) -> None:
    missing = unique_name("missing")
    sink = make_sink(amqp_url, missing)

    with pytest.raises(SinkError, match=f"exchange '{missing}' does not exist"):
        asyncio.run(sink.start())


def test_an_invalid_url_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as excinfo:
        make_sink(f"amqp://guest:{PASSWORD}@127.0.0.1/%2F?heartbeat=soon")
    assert PASSWORD not in str(excinfo.value)


def test_sink_url_from_the_cli_format(amqp_url: str) -> None:
    with temp_exchange(amqp_url) as exchange, temp_queue(amqp_url, exchange=exchange, routing_keys=["k"]) as queue:
        config = parse_sink_url(f"{amqp_url}?exchange={exchange}")
        assert isinstance(config, AmqpSinkConfig)
        sink = RabbitMQSink(config, publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS)

        [outcomes] = asyncio.run(publish_once(sink, [make_event("k")]))

        assert outcomes == [None]
        assert [m.exchange for m in queue.collect(1)] == [exchange]


def test_close_is_idempotent_and_final(amqp_url: str) -> None:
    sink = make_sink(amqp_url)

    async def scenario() -> None:
        await sink.start()
        await sink.check()
        await sink.close()
        await sink.close()
        with pytest.raises(SinkUnavailable):
            await sink.publish([make_event("t")])
        with pytest.raises(SinkUnavailable):
            await sink.check()

    asyncio.run(scenario())
    asyncio.run(make_sink(amqp_url).close())  # never started


def test_reconnects_after_the_connection_is_lost(amqp_url: str) -> None:
    with TcpProxy.to(amqp_url) as proxy, temp_queue(amqp_url) as queue:
        sink = make_sink(via_proxy(amqp_url, proxy))

        async def scenario() -> tuple[list[Outcome], list[Outcome]]:
            await sink.start()
            try:
                first = await sink.publish([make_event(queue.name)])
                proxy.cut()
                await asyncio.sleep(0.2)  # let the sink see the EOF
                assert proxy.connections == 0
                second = await sink.publish([make_event(queue.name), make_event(queue.name)])
                assert proxy.connections == 1
                proxy.cut()
                await asyncio.sleep(0.2)
                await sink.check()  # readiness reconnects too
                assert proxy.connections == 1
                return first, second
            finally:
                await sink.close()

        first, second = asyncio.run(scenario())

        assert first == [None]
        assert second == [None, None]
        assert len(queue.collect(3)) == 3


def test_losing_the_connection_before_any_confirm_is_unavailable(amqp_url: str) -> None:
    with TcpProxy.to(amqp_url) as proxy, temp_queue(amqp_url) as queue:
        sink = make_sink(via_proxy(amqp_url, proxy))
        events = [make_event(queue.name) for _ in range(50)]

        async def scenario() -> float:
            await sink.start()
            try:
                proxy.stall()
                publishing = asyncio.create_task(sink.publish(events))
                await asyncio.sleep(0.3)
                started = time.monotonic()
                proxy.cut()
                proxy.resume()
                with pytest.raises(SinkUnavailable, match="before any confirm"):
                    await publishing
                lost_after = time.monotonic() - started
                assert await sink.publish(events[:1]) == [None]
                return lost_after
            finally:
                await sink.close()

        assert asyncio.run(scenario()) < 1.0


def test_a_silent_broker_is_bounded_by_the_publish_timeout(amqp_url: str) -> None:
    with TcpProxy.to(amqp_url) as proxy, temp_queue(amqp_url) as queue:
        sink = make_sink(via_proxy(amqp_url, proxy), publish_timeout_seconds=1.5)

        async def scenario() -> tuple[float, list[Outcome]]:
            await sink.start()
            try:
                proxy.stall()
                started = time.monotonic()
                with pytest.raises(SinkUnavailable, match="no publisher confirm"):
                    await sink.publish([make_event(queue.name) for _ in range(10)])
                took = time.monotonic() - started
                proxy.resume()
                return took, await sink.publish([make_event(queue.name)])
            finally:
                await sink.close()

        took, after = asyncio.run(scenario())

        assert 1.4 < took < 3.0
        assert after == [None]
