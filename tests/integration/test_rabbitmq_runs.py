"""Runs of several events of one key in one batch, on real RabbitMQ.

A key's events go to the channel one at a time, each once the one before is
confirmed, so whatever goes wrong with one (refused, returned, never
confirmed) stops its key: the later ones of the key are answered ``HELD``,
never published, and the key is held; other keys go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

import producers
from relay.errors import SinkTimeout, SinkUnavailable
from relay.events import HELD, Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.sinks.rabbitmq import RabbitMQSink, frames
from relay.sinks.rabbitmq.batch import Batch
from relay.sinks.rabbitmq.link import Link
from tests.integration.rabbit_support import TcpProxy, temp_queue, unique_name, via_proxy
from tests.integration.test_rabbitmq_sink import make_sink, run_events
from tests.relay_support import RelayThread, outbox_counts, wait_until

pytestmark = pytest.mark.timeout(60)

#: RabbitMQ's default frame_max: headers larger than this cannot be sent.
FRAME_MAX = 131_072


class InFlight:
    """Watches a link's unconfirmed messages: per key at most one, and how many at once."""

    def __init__(self) -> None:
        self.most = 0
        self.doubled: list[str] = []

    def track(self, track: Callable[[Link, Batch, int], None]) -> Callable[[Link, Batch, int], None]:
        def watched(link: Link, batch: Batch, index: int) -> None:
            key = batch.events[index].key
            pending = link._pending.values()
            if key is not None and any(b.events[i].key == key for b, i in pending):
                self.doubled.append(key)
            track(link, batch, index)
            self.most = max(self.most, len(link._pending))

        return watched


@pytest.fixture
def in_flight(monkeypatch: pytest.MonkeyPatch) -> Iterator[InFlight]:
    watch = InFlight()
    monkeypatch.setattr(Link, "track", watch.track(Link.track))
    yield watch


def interleaved(topic: str, keys: list[str], per_key: int, *, keyless: int = 0) -> list[Event]:
    """``per_key`` events of each key, interleaved, then ``keyless`` events without a key."""
    layout: list[str | None] = [key for _ in range(per_key) for key in keys]
    layout += [None] * keyless
    return run_events([topic] * len(layout), keys=layout)


def publish(sink: RabbitMQSink, events: list[Event], holds: KeyHolds) -> list[Outcome]:
    async def scenario() -> list[Outcome]:
        await sink.start()
        try:
            return await sink.publish(events, holds)
        finally:
            await sink.close()

    return asyncio.run(scenario())


def assert_per_key_order(received: list[str | None], events: list[Event]) -> None:
    """What arrived of each key came in the order of ``events``."""
    by_id = {e.idempotency_key: e for e in events}
    arrived = set(received)
    for key in {e.key for e in events if e.key is not None}:
        got = [m for m in received if by_id[m or ""].key == key]
        assert got == [e.idempotency_key for e in events if e.key == key and e.idempotency_key in arrived], key


def test_runs_of_several_keys_arrive_in_order_one_unconfirmed_per_key(amqp_url: str, in_flight: InFlight) -> None:
    with temp_queue(amqp_url) as queue:
        keys = [f"k{n}" for n in range(8)]
        events = interleaved(queue.name, keys, per_key=40, keyless=100)
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url), events, holds)

        assert outcomes == [None] * len(events)
        received = [m.message_id for m in queue.collect(len(events))]
        assert sorted(m or "" for m in received) == sorted(e.idempotency_key for e in events)
        assert_per_key_order(received, events)
        assert in_flight.doubled == [], "a key had two unconfirmed messages"
        # Other keys, and events without a key, did not wait for each other.
        assert in_flight.most >= len(keys) + 100
        assert not any(holds.held(key) for key in keys)


def poisoned(topic: str, make_poison: Callable[[Event], Event]) -> tuple[list[Event], int]:
    """Runs of 6 for keys a, p and b, interleaved; p's fourth event is the poison."""
    events = interleaved(topic, ["a", "p", "b"], per_key=6)
    where = [i for i, e in enumerate(events) if e.key == "p"][3]
    events[where] = make_poison(events[where])
    return events, where


def assert_stopped_at(outcomes: list[Outcome], events: list[Event], where: int, holds: KeyHolds) -> list[str]:
    """The poisoned key: delivered before ``where``, failed at it, held after; the others delivered.
    Returns the idempotency keys that must be on the queue."""
    key = events[where].key
    assert key is not None
    for index, (event, outcome) in enumerate(zip(events, outcomes, strict=True)):
        if event.key != key or index < where:
            assert outcome is None, (index, outcome)
        elif index > where:
            assert outcome == HELD, (index, outcome)
    failure = outcomes[where]
    assert isinstance(failure, Failure) and not failure.held, failure
    assert holds.held(key)
    assert not any(holds.held(e.key) for e in events if e.key not in (None, key))
    return [e.idempotency_key for e, o in zip(events, outcomes, strict=True) if o is None]


def with_payload(size: int) -> Callable[[Event], Event]:
    def make(event: Event) -> Event:
        return replace(event, payload=b'"' + b"x" * size + b'"')

    return make


def with_headers(headers: dict[str, str]) -> Callable[[Event], Event]:
    def make(event: Event) -> Event:
        return replace(event, headers=headers)

    return make


def test_a_payload_refused_up_front_mid_run_holds_the_rest_of_its_key(amqp_url: str, in_flight: InFlight) -> None:
    with temp_queue(amqp_url) as queue:
        events, where = poisoned(queue.name, with_payload(500))
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url, max_message_bytes=200), events, holds)

        assert_refused_mid_run(queue, outcomes, events, where, holds, "larger than")
        assert in_flight.doubled == []


def assert_refused_mid_run(
    queue: Any, outcomes: list[Outcome], events: list[Event], where: int, holds: KeyHolds, reason: str
) -> None:
    """The event at ``where`` was refused for good (``reason``); its key stopped there; the rest arrived in order."""
    delivered = assert_stopped_at(outcomes, events, where, holds)
    failure = outcomes[where]
    assert isinstance(failure, Failure) and failure.permanent and reason in failure.error
    received = [m.message_id for m in queue.collect(len(delivered))]
    assert sorted(m or "" for m in received) == sorted(delivered)
    assert_per_key_order(received, events)


def test_headers_too_large_for_a_frame_mid_run_hold_the_rest_of_its_key(amqp_url: str) -> None:
    with temp_queue(amqp_url) as queue:
        events, where = poisoned(queue.name, with_headers({"big": "x" * (FRAME_MAX + 10)}))
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url), events, holds)

        assert_refused_mid_run(queue, outcomes, events, where, holds, "frame")


def test_a_poison_the_broker_closes_the_connection_on_is_found_and_holds_only_its_key(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch, in_flight: InFlight
) -> None:
    # Without the frame check the broker closes the connection (501): the events
    # in flight with the poison are suspects, sent again in halves until it is found.
    monkeypatch.setattr(frames, "check_header_fits", lambda size, payload_max: None)
    with temp_queue(amqp_url) as queue:
        events, where = poisoned(queue.name, with_headers({"big": "x" * 200_000}))
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url, publish_timeout_seconds=20), events, holds)

        delivered = assert_stopped_at(outcomes, events, where, holds)
        failure = outcomes[where]
        assert isinstance(failure, Failure) and "refused by RabbitMQ" in failure.error, failure
        # Suspects the broker stored before the close arrive twice (at least once):
        # the order holds once copies are dropped.
        received = list(dict.fromkeys(m.message_id for m in queue.collect(len(delivered))))
        assert sorted(m or "" for m in received) == sorted(delivered)
        assert_per_key_order(received, events)
        assert in_flight.doubled == []


def test_an_unroutable_event_mid_run_holds_the_rest_of_its_key(amqp_url: str, in_flight: InFlight) -> None:
    nowhere = unique_name("nowhere")
    with temp_queue(amqp_url) as queue:
        events, where = poisoned(queue.name, lambda event: replace(event, topic=nowhere))
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url), events, holds)

        delivered = assert_stopped_at(outcomes, events, where, holds)
        failure = outcomes[where]
        assert isinstance(failure, Failure) and failure.error.startswith("unroutable"), failure
        received = [m.message_id for m in queue.collect(len(delivered))]
        assert sorted(m or "" for m in received) == sorted(delivered)
        assert_per_key_order(received, events)
        assert in_flight.doubled == []


def test_a_nack_mid_run_holds_the_rest_of_its_key(amqp_url: str, in_flight: InFlight) -> None:
    # A full queue with overflow=reject-publish nacks what does not fit: key a's
    # fourth event, since its third is confirmed (and stored) before the fourth goes.
    full = {"x-max-length": 3, "x-overflow": "reject-publish"}
    with temp_queue(amqp_url, arguments=full) as small, temp_queue(amqp_url) as other:
        events = run_events([small.name, other.name] * 6, keys=["a", "b"] * 6)
        where = 6  # a's fourth
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url), events, holds)

        assert_stopped_at(outcomes, events, where, holds)
        failure = outcomes[where]
        assert isinstance(failure, Failure) and "nacked" in failure.error and not failure.permanent, failure
        assert [m.message_id for m in small.collect(3)] == [events[i].idempotency_key for i in (0, 2, 4)]
        assert [m.message_id for m in other.collect(6)] == [e.idempotency_key for e in events if e.key == "b"]
        assert in_flight.doubled == []


def test_a_confirm_that_never_comes_mid_run_holds_the_rest_of_its_key(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    track = Link.track

    def loses_one(link: Link, batch: Batch, index: int) -> None:
        if batch.events[index].idempotency_key == "unconfirmed":
            link._next_tag += 1  # sent, but its confirm is looked for nowhere
        else:
            track(link, batch, index)

    monkeypatch.setattr(Link, "track", loses_one)
    with temp_queue(amqp_url) as queue:
        events, where = poisoned(queue.name, lambda event: replace(event, idempotency_key="unconfirmed"))
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url, publish_timeout_seconds=1.5), events, holds)

        delivered = assert_stopped_at(outcomes, events, where, holds)
        failure = outcomes[where]
        assert isinstance(failure, Failure) and failure.timed_out, failure
        # The broker has it; nothing later of its key follows it.
        received = [m.message_id for m in queue.collect(len(delivered) + 1)]
        assert sorted(m or "" for m in received) == sorted([*delivered, "unconfirmed"])
        assert_per_key_order(received, events)


def test_a_run_longer_than_the_publish_timeout_stops_at_the_event_in_flight(amqp_url: str) -> None:
    # One confirm round trip per event: 3,000 events of one key cannot go in a second.
    with temp_queue(amqp_url) as queue:
        events = run_events([queue.name] * 3_000, keys=["hot"] * 3_000)
        holds = KeyHolds()

        outcomes = publish(make_sink(amqp_url, publish_timeout_seconds=1.0), events, holds)

        acked = next(i for i, o in enumerate(outcomes) if o is not None)
        assert 0 < acked < 3_000 - 1 and outcomes[:acked] == [None] * acked
        # In flight at the timeout (the broker may have it), or its turn had just come (never sent).
        stopped = outcomes[acked]
        assert isinstance(stopped, Failure) and (stopped.timed_out or stopped.held), stopped
        assert outcomes[acked + 1 :] == [HELD] * (3_000 - acked - 1)
        assert holds.held("hot")
        received = [m.message_id for m in queue.collect(acked)]  # and whatever follows within the settle time
        assert received[:acked] == [e.idempotency_key for e in events[:acked]]
        assert received[acked:] in ([], [events[acked].idempotency_key] if stopped.timed_out else [])


def test_a_connection_lost_mid_run_stops_the_run_where_it_was(amqp_url: str) -> None:
    with TcpProxy.to(amqp_url) as proxy, temp_queue(amqp_url) as queue:
        sink = make_sink(via_proxy(amqp_url, proxy))
        events = run_events([queue.name] * 3_000, keys=["hot"] * 3_000)
        holds = KeyHolds()

        async def scenario() -> list[Outcome]:
            await sink.start()
            try:
                publishing = asyncio.create_task(sink.publish(events, holds))
                await asyncio.sleep(0.3)
                proxy.cut()
                return await publishing
            finally:
                await sink.close()

        outcomes = asyncio.run(scenario())

        acked = next(i for i, o in enumerate(outcomes) if o is not None)
        assert 0 < acked < 3_000 - 1 and outcomes[:acked] == [None] * acked
        # Lost in flight (the broker may have it: its confirm is what was lost), or not yet sent.
        stopped = outcomes[acked]
        assert isinstance(stopped, Failure) and not stopped.held and not stopped.timed_out, stopped
        assert outcomes[acked + 1 :] == [HELD] * (3_000 - acked - 1)
        assert holds.held("hot")
        received = [m.message_id for m in queue.collect(acked)]  # and whatever follows within the settle time
        assert received[:acked] == [e.idempotency_key for e in events[:acked]]
        assert received[acked:] in ([], [events[acked].idempotency_key])


def test_a_broker_that_never_confirms_holds_every_key_before_the_timeout_is_raised(amqp_url: str) -> None:
    with TcpProxy.to(amqp_url) as proxy, temp_queue(amqp_url) as queue:
        sink = make_sink(via_proxy(amqp_url, proxy), publish_timeout_seconds=1.0)
        events = interleaved(queue.name, ["a", "b", "c"], per_key=4, keyless=2)
        holds = KeyHolds()

        async def scenario() -> None:
            await sink.start()
            try:
                proxy.stall()  # the broker gets the first events; their confirms are held back
                with pytest.raises(SinkTimeout):
                    await sink.publish(events, holds)
                proxy.resume()
            finally:
                await sink.close()

        asyncio.run(scenario())
        assert all(holds.held(key) for key in "abc")
        # Only each key's first event, and those without a key, were ever sent.
        received = [m.message_id or "" for m in queue.collect(5)]
        assert sorted(received) == sorted(e.idempotency_key for e in events if not e.chained)


def test_a_lost_connection_holds_every_key_before_unavailable_is_raised(amqp_url: str) -> None:
    with TcpProxy.to(amqp_url) as proxy, temp_queue(amqp_url) as queue:
        sink = make_sink(via_proxy(amqp_url, proxy))
        events = interleaved(queue.name, ["a", "b"], per_key=5)
        holds = KeyHolds()

        async def scenario() -> None:
            await sink.start()
            try:
                proxy.stall()
                publishing = asyncio.create_task(sink.publish(events, holds))
                await asyncio.sleep(0.3)
                proxy.cut()
                proxy.resume()
                with pytest.raises(SinkUnavailable, match="before any confirm"):
                    await publishing
            finally:
                await sink.close()

        asyncio.run(scenario())
        assert holds.held("a") and holds.held("b")


def test_the_relay_drains_runs_of_hot_keys_in_order_and_parks_only_a_poisoned_key(
    database_url: str, amqp_url: str
) -> None:
    with temp_queue(amqp_url) as queue:
        with psycopg.connect(database_url) as conn:
            for n in range(150):
                for key in ("h0", "h1", "h2", "h3"):
                    producers.publish(conn, queue.name, {"n": n}, key=key, idempotency_key=f"{key}-{n}")
            for n in range(10):
                headers = {"big": "x" * (FRAME_MAX + 10)} if n == 4 else None
                producers.publish(conn, queue.name, {"n": n}, key="p", headers=headers, idempotency_key=f"p-{n}")
        with RelayThread(database_url, amqp_url):
            # The poison is dead-lettered at once (too large for a frame); it blocks its key.
            wait_until(lambda: outbox_counts(database_url) == {"failed": 1, "pending": 5}, timeout=60)
            received = [m.message_id or "" for m in queue.collect(604)]
    assert sorted(received) == sorted([f"{k}-{n}" for k in ("h0", "h1", "h2", "h3") for n in range(150)]
                                      + [f"p-{n}" for n in range(4)])  # fmt: skip
    for key in ("h0", "h1", "h2", "h3", "p"):
        of_key = [int(m.rsplit("-", 1)[1]) for m in received if m.startswith(f"{key}-")]
        assert of_key == sorted(of_key), key


def chained_on(earlier: list[Event], later: list[Event]) -> list[Event]:
    """``later`` as the loop hands it over while ``earlier`` is in flight: its keys seen before are chained."""
    flying = {e.key for e in earlier if e.key is not None}
    return [replace(e, chained=True) if e.key in flying else e for e in later]


def publish_together(sink: RabbitMQSink, batches: list[list[Event]], holds: KeyHolds) -> list[list[Outcome]]:
    """The batches published at once, in this order, as the relay's pipeline does."""

    async def scenario() -> list[list[Outcome]]:
        await sink.start()
        try:
            return list(await asyncio.gather(*(sink.publish(batch, holds) for batch in batches)))
        finally:
            await sink.close()

    return asyncio.run(scenario())


def test_batches_in_flight_together_keep_each_keys_order_with_one_unconfirmed_message_per_key(
    amqp_url: str, in_flight: InFlight
) -> None:
    with temp_queue(amqp_url) as queue:
        keys = [f"k{n}" for n in range(6)]
        batches = [interleaved(queue.name, keys, per_key=15, keyless=20) for _ in range(3)]
        for n in range(1, len(batches)):
            batches[n] = chained_on([e for batch in batches[:n] for e in batch], batches[n])
        holds = KeyHolds()

        results = publish_together(make_sink(amqp_url), batches, holds)

        everything = [e for batch in batches for e in batch]
        assert all(outcome is None for outcomes in results for outcome in outcomes)
        received = [m.message_id for m in queue.collect(len(everything))]
        assert sorted(m or "" for m in received) == sorted(e.idempotency_key for e in everything)
        assert_per_key_order(received, everything)
        assert in_flight.doubled == [], "a key had two unconfirmed messages, across batches"
        assert not any(holds.held(key) for key in keys)


def test_a_failure_at_the_end_of_a_keys_run_holds_its_events_in_the_batches_after_it(
    amqp_url: str, in_flight: InFlight
) -> None:
    nowhere = unique_name("nowhere")
    with temp_queue(amqp_url) as queue:
        first = interleaved(queue.name, ["a", "p", "b"], per_key=4)
        last_of_p = max(i for i, e in enumerate(first) if e.key == "p")
        first[last_of_p] = replace(first[last_of_p], topic=nowhere)  # returned: NO_ROUTE
        second = chained_on(first, interleaved(queue.name, ["a", "p", "b"], per_key=4))
        third = chained_on(first + second, interleaved(queue.name, ["p", "b"], per_key=2))
        holds = KeyHolds()

        outcomes = publish_together(make_sink(amqp_url), [first, second, third], holds)

        returned = outcomes[0][last_of_p]
        assert isinstance(returned, Failure) and returned.error.startswith("unroutable"), returned
        for batch, results in ((second, outcomes[1]), (third, outcomes[2])):
            for event, outcome in zip(batch, results, strict=True):
                assert outcome == (HELD if event.key == "p" else None), (event.key, outcome)
        assert holds.held("p") and not holds.held("a") and not holds.held("b")
        delivered = [e for batch, results in zip([first, second, third], outcomes, strict=True)
                     for e, o in zip(batch, results, strict=True) if o is None]  # fmt: skip
        received = [m.message_id for m in queue.collect(len(delivered))]
        assert sorted(m or "" for m in received) == sorted(e.idempotency_key for e in delivered)
        assert_per_key_order(received, first + second + third)
        assert in_flight.doubled == []


def test_a_batch_refused_in_full_up_front_still_waits_for_the_batch_before_and_reports_every_event(
    amqp_url: str,
) -> None:
    # Every event of the second batch is too large: nothing of it needs the broker, but its
    # first event of the key waits for the first batch, and must not come back "acknowledged".
    with temp_queue(amqp_url) as queue:
        first = interleaved(queue.name, ["a"], per_key=3)
        second = chained_on(
            first, [replace(e, payload=b'"' + b"x" * 5000 + b'"') for e in interleaved(queue.name, ["a"], per_key=2)]
        )
        holds = KeyHolds()

        outcomes = publish_together(make_sink(amqp_url, max_message_bytes=1000), [first, second], holds)

        assert outcomes[0] == [None] * 3
        assert all(isinstance(o, Failure) for o in outcomes[1]), outcomes[1]
        assert [m.message_id for m in queue.collect(3)] == [e.idempotency_key for e in first]


def test_headers_too_large_and_a_3_mb_payload_at_the_start_of_chained_runs(amqp_url: str) -> None:
    # Inputs of other sizes where a chained batch starts: key a's first event there cannot be framed
    # (permanent, the rest of a held); key b's is 3 MB, which RabbitMQ takes, in its order.
    with temp_queue(amqp_url) as queue:
        first = interleaved(queue.name, ["a", "b"], per_key=3)
        second = chained_on(first, interleaved(queue.name, ["a", "b"], per_key=3))
        first_a = next(i for i, e in enumerate(second) if e.key == "a")
        first_b = next(i for i, e in enumerate(second) if e.key == "b")
        second[first_a] = replace(second[first_a], headers={"h": "x" * (FRAME_MAX + 1)})
        second[first_b] = replace(second[first_b], payload=b'"' + b"y" * 3_000_000 + b'"')
        holds = KeyHolds()

        outcomes = publish_together(make_sink(amqp_url), [first, second], holds)

        assert outcomes[0] == [None] * len(first)
        of_a = [o for e, o in zip(second, outcomes[1], strict=True) if e.key == "a"]
        of_b = [o for e, o in zip(second, outcomes[1], strict=True) if e.key == "b"]
        assert isinstance(of_a[0], Failure) and of_a[0].permanent and of_a[1:] == [HELD, HELD], of_a
        assert of_b == [None] * 3 and holds.held("a") and not holds.held("b")
        received = [m.message_id for m in queue.collect(len(first) + 3)]
        assert_per_key_order(received, first + second)
