"""What the RabbitMQ link makes of messages awaiting a confirm when it goes down."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pika.exceptions
import pytest

from relay.events import Failure
from relay.sinks.rabbitmq.batch import Batch
from relay.sinks.rabbitmq.link import Link
from tests.unit.test_rabbitmq_batch import claimed

LOSSES = {
    "connection forced (an operator, a node restart)": pika.exceptions.ConnectionClosedByBroker(
        320, "CONNECTION_FORCED - closed via management plugin"
    ),
    "connection reset": pika.exceptions.StreamLostError("Transport indicated EOF"),
    "heartbeat missed": pika.exceptions.AMQPHeartbeatTimeout("no heartbeat in 60 s"),
}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("error", LOSSES.values(), ids=LOSSES.keys())
def test_a_lost_connection_gives_back_what_awaited_a_confirm_without_spending_an_attempt(
    loop: asyncio.AbstractEventLoop, error: BaseException
) -> None:
    """The events are not to blame, and the broker may have them: not an attempt (docs/delivery.md)."""
    link = Link(loop, "", "amqp://relay:***@broker/", lambda _: None)
    batch = Batch(claimed(["a", "a", "b", None]), loop, None)
    assert batch.take_ready() == [0, 2, 3]
    batch.resolve(0, None, settled=True)  # the batch is partly confirmed ...
    assert batch.take_ready() == [1]
    link._pending = {2: (batch, 1), 3: (batch, 2), 4: (batch, 3)}  # ... and these await their confirms

    link._on_connection_closed(None, error)  # type: ignore[arg-type]

    assert batch.outcomes[0] is None
    for index in (1, 2, 3):
        outcome = batch.outcomes[index]
        assert isinstance(outcome, Failure) and outcome.unavailable and not outcome.permanent, outcome
        assert outcome.error.startswith("unconfirmed, connection closed")
