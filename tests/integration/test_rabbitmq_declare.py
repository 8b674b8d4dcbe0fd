"""``declare=TYPE`` in an amqp sink URL: the relay declares its exchange, on the real RabbitMQ."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pika.exceptions
import pytest
from pika.exchange_type import ExchangeType

from relay.config import AmqpSinkConfig, parse_sink_url
from relay.errors import SinkError
from relay.events import Outcome
from relay.sinks.rabbitmq import RabbitMQSink
from tests.integration.kafka_support import make_event
from tests.integration.rabbit_support import rabbit_channel, temp_exchange, temp_queue, unique_name

pytestmark = pytest.mark.timeout(60)


def sink_for(url: str) -> RabbitMQSink:
    config = parse_sink_url(url)
    assert isinstance(config, AmqpSinkConfig)
    return RabbitMQSink(config, publish_timeout_seconds=5.0)


async def start_and_close(sink: RabbitMQSink) -> None:
    await sink.start()
    await sink.close()


async def publish(sink: RabbitMQSink, topic: str) -> list[Outcome]:
    await sink.start()
    try:
        return await sink.publish([make_event(topic)])
    finally:
        await sink.close()


@contextlib.contextmanager
def deleted_afterwards(amqp_url: str, exchange: str) -> Iterator[None]:
    try:
        yield
    finally:
        with rabbit_channel(amqp_url) as channel, contextlib.suppress(pika.exceptions.AMQPError):
            channel.exchange_delete(exchange)


def declared_as(amqp_url: str, exchange: str, exchange_type: str) -> bool:
    """Whether ``exchange`` exists as a durable exchange of ``exchange_type`` (a declaration
    with other settings is refused with 406)."""
    try:
        with rabbit_channel(amqp_url) as channel:
            channel.exchange_declare(exchange, exchange_type=ExchangeType(exchange_type), durable=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 406, exc
        return False


@pytest.mark.parametrize("exchange_type", ["topic", "direct", "fanout", "headers"])
def test_declare_creates_a_missing_durable_exchange_of_that_type(amqp_url: str, exchange_type: str) -> None:
    exchange = unique_name("relay-test-declared")
    with deleted_afterwards(amqp_url, exchange):
        asyncio.run(start_and_close(sink_for(f"{amqp_url}?exchange={exchange}&declare={exchange_type}")))
        assert declared_as(amqp_url, exchange, exchange_type)
        others = [t for t in ("topic", "direct", "fanout", "headers") if t != exchange_type]
        assert not declared_as(amqp_url, exchange, others[0])


def test_a_declared_topic_exchange_routes_by_pattern_and_a_second_relay_finds_it_as_it_is(amqp_url: str) -> None:
    exchange = unique_name("relay-test-declared")
    url = f"{amqp_url}?exchange={exchange}&declare=topic"
    with deleted_afterwards(amqp_url, exchange):
        asyncio.run(start_and_close(sink_for(url)))
        with temp_queue(amqp_url, exchange=exchange, routing_keys=["orders.*"]) as queue:
            outcomes = asyncio.run(publish(sink_for(url), "orders.created"))
            assert outcomes == [None]
            assert [m.routing_key for m in queue.collect(1)] == ["orders.created"]


@pytest.mark.parametrize(("existing", "asked"), [("direct", "topic"), ("topic", "fanout"), ("fanout", "headers")])
def test_an_exchange_of_another_type_is_a_start_up_error_naming_both(amqp_url: str, existing: str, asked: str) -> None:
    with temp_exchange(amqp_url, existing) as exchange:
        sink = sink_for(f"{amqp_url}?exchange={exchange}&declare={asked}")
        with pytest.raises(SinkError) as refused:
            asyncio.run(sink.start())
        asyncio.run(sink.close())
        message = str(refused.value)
        assert f"exchange '{exchange}'" in message and f"durable {asked} exchange" in message, message
        assert "guest:guest" not in message
        assert declared_as(amqp_url, exchange, existing), "the existing exchange must be left as it was"


def test_without_declare_a_missing_exchange_says_how_to_have_it_declared(amqp_url: str) -> None:
    missing = unique_name("relay-test-missing")
    sink = sink_for(f"{amqp_url}?exchange={missing}")
    with pytest.raises(SinkError, match=f"exchange '{missing}' does not exist.*declare=topic"):
        asyncio.run(sink.start())
    asyncio.run(sink.close())
    with rabbit_channel(amqp_url) as channel, pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channel.exchange_declare(missing, passive=True)
