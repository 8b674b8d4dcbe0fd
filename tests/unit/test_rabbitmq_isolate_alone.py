"""A suspect sent again alone is convicted only for a refusal of its own.

_isolate (relay/sinks/rabbitmq/sink.py) takes the link, then waits for the send lock; another batch
holding the lock gets the channel closed in refusal (its own poison message). The suspect was then
never written, yet came back a suspect, and a group of one was convicted: an innocent event charged
an attempt as "refused by RabbitMQ" (dead-lettered at --max-attempts). It now goes again on a fresh
channel, where its confirm clears it. (Found by a review helper.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pika.exceptions
from pika import spec

from relay.config import AmqpSinkConfig
from relay.holds import KeyHolds
from relay.sinks.rabbitmq.batch import Batch
from relay.sinks.rabbitmq.link import Link
from relay.sinks.rabbitmq.sink import RabbitMQSink
from tests.unit.test_rabbitmq_batch import claimed


class _Channel:
    is_open = True

    def __init__(self, number: int) -> None:
        self.channel_number = number

    def add_on_close_callback(self, _: object) -> None:
        pass

    def add_on_return_callback(self, _: object) -> None:
        pass

    def confirm_delivery(self, _: object, callback: Callable[[Any], None]) -> None:
        asyncio.get_running_loop().call_soon(callback, None)


class _Conn:
    is_open = True
    is_closed = False
    is_closing = False
    params = SimpleNamespace(frame_max=131072)

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []  # (channel number, frames)
        self.channels = 1

    def send_frames(self, data: bytes) -> None:
        self.sent.append((self.channels, data))

    def corked(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def channel(self, on_open_callback: Callable[[_Channel], None]) -> None:
        self.channels += 1  # the broker answers later, as pika's callbacks come
        asyncio.get_running_loop().call_soon(on_open_callback, _Channel(self.channels))


def test_a_suspect_whose_channel_another_batch_closed_goes_again_on_a_fresh_one_and_is_cleared() -> None:
    async def scenario() -> tuple[object, list[int]]:
        loop = asyncio.get_running_loop()
        sink = RabbitMQSink(AmqpSinkConfig("amqp://guest:guest@broker/"), publish_timeout_seconds=5)
        link = Link(loop, "", "amqp://broker/", lambda _: None)
        conn, channel = _Conn(), _Channel(1)
        link._connection = conn  # type: ignore[assignment]
        link.channel = channel  # type: ignore[assignment]
        sink._link = link
        batch = Batch(claimed(["x"]), loop, KeyHolds())
        assert batch.take_ready() == [0]
        # x was in flight when another message closed the channel in refusal: x is a suspect.
        batch.suspect([0], "unconfirmed, channel closed by the broker: 406 PRECONDITION_FAILED")
        await sink._send_lock.acquire()  # another batch is sending (its own poison message)
        task = asyncio.create_task(sink._isolate(batch, loop.time() + 5, set()))
        for _ in range(5):
            await asyncio.sleep(0)  # _isolate has its link and waits for the send lock
        # The other batch's poison message closes the channel in refusal; x was not on it.
        channel.is_open = False
        link._on_channel_closed(
            channel,  # type: ignore[arg-type]
            pika.exceptions.ChannelClosedByBroker(406, "PRECONDITION_FAILED - other batch's message"),
        )
        sink._send_lock.release()
        while not conn.sent and not task.done():
            await asyncio.sleep(0.01)
        link._on_confirm(SimpleNamespace(method=spec.Basic.Ack(delivery_tag=1)))  # type: ignore[arg-type]
        assert await asyncio.wait_for(task, 5)
        return batch.outcomes[0], [number for number, _ in conn.sent]

    outcome, channels = asyncio.run(scenario())
    assert channels == [2], "x went again once, on the fresh channel"
    assert outcome is None, f"x, confirmed on its own, is acknowledged, not convicted: {outcome}"
