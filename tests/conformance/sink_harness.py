"""The sink contract harness: each contract test gets every sink through one fixture, ``sh``.

A harness builds its sink, makes events it can deliver, turns one into an
event the broker will not acknowledge (``poison``), stages an outage around a
``publish`` call, and reads back what reached the broker, per key, in the
broker's order. Real brokers answer for Kafka (a Tansu of the test's own, so
it may be frozen and stopped) and RabbitMQ (through a proxy that can stall or
cut the link); the memory sink uses its own failure injection. A throwaway kind,
registered by its harness as the relay registers its own, passes the same contract,
and so does a :class:`~relay.sinks.routing.RoutingSink` over two memory sinks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal, Protocol

from relay.config import AmqpSinkConfig, Format, KafkaSinkConfig, parse_sink_url
from relay.errors import SinkError, SinkUnavailable
from relay.events import HELD, IDEMPOTENCY_HEADER, Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.sinks import build_sink
from relay.sinks.base import Sink
from relay.sinks.keyorder import Turns
from relay.sinks.memory import MemorySink
from relay.sinks.registry import SINK_KINDS, SinkKind
from relay.sinks.routing import Route, RoutingSink

Outage = Literal["stall", "gone"]
#: What a publish during an outage came to: its outcomes, or the error it raised.
Result = list[Outcome] | SinkError
PUBLISH_TIMEOUT_SECONDS = 1.5
#: Kafka refuses a message over this many bytes (the producer's message.max.bytes).
KAFKA_MAX_BYTES = 2000


class SinkHarness(Protocol):
    """One sink kind under the contract."""

    kind: str

    def sink(self) -> Sink:
        """A new, unstarted sink of this kind."""

    def event(self, key: str | None, *, chained: bool) -> Event:
        """An event the broker will acknowledge."""

    def poison(self, event: Event) -> Event:
        """``event`` changed so that the broker never acknowledges it (refused, returned, failed)."""

    async def outage(self, kind: Outage, publish: Callable[[], Awaitable[list[Outcome]]]) -> Result:
        """Run ``publish`` while the broker stalls (answers nothing) or goes away; restore it after."""

    def received(self, count: int) -> dict[str, list[str]]:
        """Each key's idempotency keys as the broker holds them (first copies), once ``count`` arrived."""

    def close(self) -> None:
        """Release what the harness holds (queues, brokers)."""


def make_event(topic: str, key: str | None, *, chained: bool) -> Event:
    """An :class:`Event` as a claim hands it to a sink."""
    ik = str(uuid.uuid4())
    return Event(
        id=hash(ik) & 0xFFFFFFF,
        topic=topic,
        key=key,
        payload=b'{"n": "%s"}' % ik.encode(),
        headers={},
        idempotency_key=ik,
        attempts=1,
        created_at=datetime.now(UTC),
        chained=chained,
    )


class Recorded:
    """The events a harness made, by idempotency key, to tell the keys of what came back."""

    def __init__(self) -> None:
        self.events: dict[str, Event] = {}

    def keep(self, event: Event) -> Event:
        self.events[event.idempotency_key] = event
        return event

    def by_key(self, iks: list[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = defaultdict(list)
        for ik in dict.fromkeys(iks):
            key = self.events[ik].key
            if key is not None:
                out[key].append(ik)
        return dict(out)


class MemoryHarness(Recorded):
    """The in-memory sink, failing what ``poison`` marks and what an outage covers."""

    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.poisoned: set[str] = set()
        self.stalled = False
        self._sinks: list[MemorySink] = []

    def sink(self) -> Sink:
        sink = MemorySink(fail=self._fail)
        self._sinks.append(sink)
        return sink

    def _fail(self, event: Event) -> Outcome:
        if self.stalled:
            return Failure("memory: no acknowledgement in time", timed_out=True)
        if event.idempotency_key in self.poisoned:
            return Failure("memory: refused", permanent=True)
        return None

    def event(self, key: str | None, *, chained: bool) -> Event:
        return self.keep(make_event("memory-topic", key, chained=chained))

    def poison(self, event: Event) -> Event:
        self.poisoned.add(event.idempotency_key)
        return event

    async def outage(self, kind: Outage, publish: Callable[[], Awaitable[list[Outcome]]]) -> Result:
        self.stalled = kind == "stall"
        for sink in self._sinks:
            sink.available = kind != "gone"
        try:
            return await publish()
        except SinkError as exc:
            return exc
        finally:
            self.stalled = False
            for sink in self._sinks:
                sink.available = True

    def received(self, count: int) -> dict[str, list[str]]:
        return self.by_key([e.idempotency_key for sink in self._sinks for e in sink.delivered])

    def close(self) -> None:
        pass


class RoutingHarness(MemoryHarness):
    """A :class:`RoutingSink` over two memory sinks, by topic: a key's events all go to one of them
    (the claim hands out a key's run to one topic), and the keys ``a``, ``b``, ``p`` to both."""

    kind = "routing"

    def __init__(self) -> None:
        super().__init__()
        self._keyless = 0

    def sink(self) -> Sink:
        left, right = MemorySink(fail=self._fail), MemorySink(fail=self._fail)
        self._sinks += [left, right]
        return RoutingSink([Route("left-*", left, "left"), Route("right-*", right, "right")])

    def event(self, key: str | None, *, chained: bool) -> Event:
        if key is None:
            self._keyless += 1
        side = sum(map(ord, key)) if key is not None else self._keyless
        return self.keep(make_event("right-t" if side % 2 else "left-t", key, chained=chained))


class KafkaHarness(Recorded):
    """The Kafka sink on a Tansu of the test's own; a message over ``KAFKA_MAX_BYTES`` is the poison."""

    kind = "kafka"

    def __init__(self) -> None:
        super().__init__()
        from tests.integration.kafka_support import running_tansu, unique_topic

        self._stack = contextlib.ExitStack()
        self.tansu = self._stack.enter_context(running_tansu())
        self.topic = unique_topic("contract")

    def sink(self) -> Sink:
        from relay.sinks.kafka import KafkaSink

        config = KafkaSinkConfig(self.tansu.bootstrap, options={"message.max.bytes": str(KAFKA_MAX_BYTES)})
        return KafkaSink(config, publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS, connect_timeout_seconds=3.0)

    def event(self, key: str | None, *, chained: bool) -> Event:
        return self.keep(make_event(self.topic, key, chained=chained))

    def poison(self, event: Event) -> Event:
        return self.keep(replace(event, payload=b'"' + b"x" * (2 * KAFKA_MAX_BYTES) + b'"'))

    async def outage(self, kind: Outage, publish: Callable[[], Awaitable[list[Outcome]]]) -> Result:
        process = self.tansu._process
        assert process is not None
        if kind == "stall":
            os.kill(process.pid, signal.SIGSTOP)  # connected, answering nothing
            await asyncio.sleep(0.2)  # stopped for sure (the warm-up's last answers are in)
        else:
            self.tansu.stop()
        try:
            return await publish()
        except SinkError as exc:
            return exc
        finally:
            if kind == "stall":
                os.kill(process.pid, signal.SIGCONT)
            else:
                self.tansu.start()  # same port, empty

    def received(self, count: int) -> dict[str, list[str]]:
        from tests.integration.kafka_support import consume

        messages = sorted(consume(self.tansu.bootstrap, self.topic, count=count), key=lambda m: (m.partition, m.offset))
        return self.by_key([m.headers[IDEMPOTENCY_HEADER].decode() for m in messages])

    def close(self) -> None:
        self._stack.close()


class RabbitHarness(Recorded):
    """The RabbitMQ sink through a proxy to the broker; a routing key no queue is bound to is the poison."""

    kind = "rabbitmq"

    def __init__(self, amqp_url: str) -> None:
        super().__init__()
        from tests.integration.rabbit_support import TcpProxy, temp_queue, unique_name, via_proxy

        self._stack = contextlib.ExitStack()
        self.proxy = self._stack.enter_context(TcpProxy.to(amqp_url))
        self.queue = self._stack.enter_context(temp_queue(amqp_url))
        self.url = via_proxy(amqp_url, self.proxy)
        self.nowhere = unique_name("nowhere")

    def sink(self) -> Sink:
        from relay.sinks.rabbitmq import RabbitMQSink

        return RabbitMQSink(
            AmqpSinkConfig(url=self.url), publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS, connect_timeout_seconds=3.0
        )

    def event(self, key: str | None, *, chained: bool) -> Event:
        return self.keep(make_event(self.queue.name, key, chained=chained))

    def poison(self, event: Event) -> Event:
        return self.keep(replace(event, topic=self.nowhere))  # mandatory: returned, never confirmed as routed

    async def outage(self, kind: Outage, publish: Callable[[], Awaitable[list[Outcome]]]) -> Result:
        self.proxy.stall()  # the broker gets what is sent; its answers are held back
        try:
            publishing = asyncio.ensure_future(publish())
            if kind == "gone":
                await asyncio.sleep(0.3)
                self.proxy.cut()
            return await publishing
        except SinkError as exc:
            return exc
        finally:
            self.proxy.resume()

    def received(self, count: int) -> dict[str, list[str]]:
        return self.by_key([m.message_id or "" for m in self.queue.collect(count)])

    def close(self) -> None:
        self._stack.close()


@dataclass(frozen=True, slots=True)
class ThrowawayConfig:
    """The throwaway kind's configuration: ``throwaway://NAME``."""

    name: str
    format: Format = Format.NATIVE


class ThrowawaySink:
    """A sink of a kind registered only by this harness, through the relay's own registry: a list as
    its broker. It refuses events whose topic is ``REFUSED_TOPIC``; ``stalled`` answers nothing in
    time, ``available = False`` is a broker gone."""

    name = "throwaway"
    chains_keys = True

    def __init__(self, config: ThrowawayConfig) -> None:
        self.config = config
        self.log: list[Event] = []
        self.stalled = False
        self.available = True
        self._handing_over = asyncio.Lock()

    async def start(self) -> None:
        await self.check()

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        turns = Turns(events, holds)  # the shared key-order piece (relay.sinks.keyorder), as a sink author uses it
        if not self.available:
            turns.hold(range(len(events)))
            raise SinkUnavailable("throwaway broker gone")
        async with self._handing_over:  # batches reach the broker in call order
            return [await self._send(turns, index) for index in range(len(events))]

    async def _send(self, turns: Turns, index: int) -> Outcome:
        if not turns.admit(index):
            return HELD
        event = turns.events[index]
        outcome: Outcome = None
        if self.stalled:
            outcome = Failure("throwaway: no acknowledgement in time", timed_out=True)
        elif event.topic == REFUSED_TOPIC:
            outcome = Failure("throwaway: refused", permanent=True)
        if outcome is None:
            self.log.append(event)
        else:
            turns.hold((index,))
        await asyncio.sleep(0)  # a later publish call may come in meanwhile
        return outcome

    async def check(self) -> None:
        if not self.available:
            raise SinkUnavailable("throwaway broker gone")

    async def close(self) -> None:
        pass


REFUSED_TOPIC = "refuse-me"
THROWAWAY = SinkKind(
    name="throwaway",
    schemes=("throwaway",),
    config_type=ThrowawayConfig,
    parse=lambda url: ThrowawayConfig(url.split("://", 1)[1]),
    build=lambda config, **_: ThrowawaySink(config),
    grace_seconds=lambda: 0.5,
    refuses_header=lambda name: "no x- headers" if name.startswith("x-") else None,
    binding_header=lambda name: False,
)


class ThrowawayHarness(Recorded):
    """A sink kind registered in the test, built through ``parse_sink_url`` and ``build_sink`` as the
    relay builds its own."""

    kind = "throwaway"

    def __init__(self) -> None:
        super().__init__()
        SINK_KINDS.register(THROWAWAY)
        self._sinks: list[ThrowawaySink] = []

    def sink(self) -> Sink:
        sink = build_sink(parse_sink_url("throwaway://contract"), publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS)
        assert isinstance(sink, ThrowawaySink)
        self._sinks.append(sink)
        return sink

    def event(self, key: str | None, *, chained: bool) -> Event:
        return self.keep(make_event("throwaway-topic", key, chained=chained))

    def poison(self, event: Event) -> Event:
        return self.keep(replace(event, topic=REFUSED_TOPIC))

    async def outage(self, kind: Outage, publish: Callable[[], Awaitable[list[Outcome]]]) -> Result:
        for sink in self._sinks:
            sink.stalled, sink.available = kind == "stall", kind != "gone"
        try:
            return await publish()
        except SinkError as exc:
            return exc
        finally:
            for sink in self._sinks:
                sink.stalled, sink.available = False, True

    def received(self, count: int) -> dict[str, list[str]]:
        return self.by_key([e.idempotency_key for sink in self._sinks for e in sink.log])

    def close(self) -> None:
        SINK_KINDS.unregister(THROWAWAY.name)


@contextlib.contextmanager
def harness_for(kind: str, amqp_url: Callable[[], str]) -> Iterator[SinkHarness]:
    """The harness of sink ``kind``, closed on exit."""
    harness: SinkHarness
    if kind == "memory":
        harness = MemoryHarness()
    elif kind == "kafka":
        harness = KafkaHarness()
    elif kind == "rabbitmq":
        harness = RabbitHarness(amqp_url())
    elif kind == "throwaway":
        harness = ThrowawayHarness()
    elif kind == "routing":
        harness = RoutingHarness()
    else:
        raise ValueError(f"no sink harness {kind!r}")
    try:
        yield harness
    finally:
        harness.close()
