"""The RabbitMQ sink never reports acknowledged an event its batch did not decide."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from relay.config import AmqpSinkConfig, parse_sink_url
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.sinks.keyorder import KeyOrder
from relay.sinks.rabbitmq.batch import Batch
from relay.sinks.rabbitmq.sink import UNDECIDED, RabbitMQSink, undecided_failed


def events(keys: list[str | None]) -> list[Event]:
    return [Event(n, "t", key, b"{}", {}, f"id-{n}", 0, datetime.now(UTC)) for n, key in enumerate(keys)]


class EarlyReturn(RabbitMQSink):
    """A driving path that returns with some events decided and the rest not (the bug guarded against)."""

    decided = 2

    async def _publish(self, batch: Batch) -> list[Outcome]:
        for index in batch.take_ready()[: self.decided]:
            batch.resolve(index, None, settled=True)
        return batch.outcomes


def test_undecided_events_are_failures_and_hold_their_keys_whatever_path_left_them() -> None:
    async def run() -> tuple[list[Outcome], KeyHolds]:
        config = parse_sink_url("amqp://guest:guest@127.0.0.1:9/")
        assert isinstance(config, AmqpSinkConfig)
        sink = EarlyReturn(config, publish_timeout_seconds=1)
        holds = KeyHolds()
        return await sink.publish(events(["a", "b", "a", "c", None]), holds), holds

    outcomes, holds = asyncio.run(run())
    # "a" (0) and "b" (1) were confirmed; nothing decided the rest.
    assert outcomes[:2] == [None, None]
    assert outcomes[2:] == [UNDECIDED] * 3
    assert isinstance(UNDECIDED, Failure) and not UNDECIDED.permanent and not UNDECIDED.held
    assert [holds.held(k) for k in ("a", "b", "c")] == [True, False, True]


def test_a_later_batch_waiting_on_an_undecided_event_goes_on() -> None:
    loop = asyncio.new_event_loop()
    try:
        holds = KeyHolds()
        keys = KeyOrder()
        earlier = Batch(events(["c", "d"]), loop, holds)
        with keys.entered(earlier.turns):
            earlier.resolve(earlier.take_ready()[1], None, settled=True)  # "d" confirmed, "c" never decided
            later = Batch(events(["c", "d"]), loop, holds)
            with keys.entered(later.turns):
                later.after()
                assert later.waiting == {0}
                assert undecided_failed(earlier, list(earlier.outcomes)) == [UNDECIDED, None]
                assert later.waiting == set()
                assert sorted(later.take_ready()) == [0, 1]
                assert holds.held("c") and not holds.held("d")
    finally:
        loop.close()
