"""An event RabbitMQ refuses never stalls the others, and timeouts are told apart (real RabbitMQ).

Refusals the sink can foresee (headers too large for the negotiated frame) fail
up front, for good. Whatever the broker still refuses by closing the channel or
the connection is traced to the event that caused it: that event fails (an
attempt spent, so it ends dead-lettered) and its neighbours are delivered. The
second kind is produced here by switching the up-front frame check off, so the
broker itself closes the connection (501 frame_too_large).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import psycopg
import pytest

import producers
from relay.errors import SinkTimeout
from relay.events import Event, Failure
from relay.sinks.rabbitmq import frames
from relay.sinks.rabbitmq.batch import Batch
from relay.sinks.rabbitmq.link import Link
from tests.integration.kafka_support import make_event
from tests.integration.rabbit_support import TcpProxy, temp_queue, via_proxy
from tests.integration.test_rabbitmq_sink import make_sink, publish_once
from tests.relay_support import RelayThread, outbox_counts, wait_until

pytestmark = pytest.mark.timeout(120)

#: RabbitMQ's default frame_max; a content header larger than this closes the connection.
FRAME_MAX = 131_072
#: Headers that cannot fit one frame, in several shapes.
TOO_LARGE_HEADERS = {
    "one long value": {"big": "x" * (FRAME_MAX + 10)},
    "many headers": {f"h{n:04d}": "v" * 100 for n in range(1_400)},
    "multi-byte characters": {"text": "é" * (FRAME_MAX // 2 + 10)},
}


@pytest.fixture
def broker_refuses_what_the_sink_would_catch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Switch the up-front frame check off: the broker closes the connection instead."""
    monkeypatch.setattr(frames, "check_header_fits", lambda size, payload_max: None)
    yield


def poison(topic: str, idempotency_key: str = "poison") -> Event:
    return make_event(topic, key="poison", headers={"big": "x" * 200_000}, idempotency_key=idempotency_key)


@pytest.mark.parametrize("headers", TOO_LARGE_HEADERS.values(), ids=TOO_LARGE_HEADERS.keys())
def test_headers_too_large_for_a_frame_fail_up_front_for_good(amqp_url: str, headers: dict[str, str]) -> None:
    with temp_queue(amqp_url) as queue:
        before, after = make_event(queue.name), make_event(queue.name)
        refused = make_event(queue.name, headers=headers)
        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url), [before, refused, after]))
        assert outcomes[0] is None and outcomes[2] is None, outcomes
        failure = outcomes[1]
        assert isinstance(failure, Failure) and failure.permanent and "frame" in failure.error, failure
        assert sorted(m.message_id or "" for m in queue.collect(2)) == sorted([before.idempotency_key,
                                                                                after.idempotency_key])  # fmt: skip


def test_headers_that_just_fit_are_delivered(amqp_url: str) -> None:
    with temp_queue(amqp_url) as queue:
        event = make_event(queue.name, headers={"big": "x" * (FRAME_MAX - 400)})
        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url), [event]))
        assert outcomes == [None]
        assert [m.headers["big"] for m in queue.collect(1)] == ["x" * (FRAME_MAX - 400)]


def test_the_reproduction_a_poison_event_and_forty_others_all_settle(database_url: str, amqp_url: str) -> None:
    # Before: the broker closed the connection on the poison, the batch went
    # back without an attempt spent, and the poison headed every claim: none of
    # the 41 events was delivered in 90 s.
    with temp_queue(amqp_url) as queue:
        write_poison_and_forty(database_url, queue.name)
        started = time.monotonic()
        with RelayThread(database_url, amqp_url, max_attempts=3):
            wait_until(lambda: outbox_counts(database_url) == {"failed": 1}, timeout=30)
        assert time.monotonic() - started < 30
        assert sorted(m.message_id or "" for m in queue.collect(40)) == sorted(f"ok-{i}" for i in range(40))
    assert dead_letters(database_url) == [("poison", 1)], "refused up front: dead-lettered at the first attempt"


def write_poison_and_forty(database_url: str, topic: str) -> None:
    with psycopg.connect(database_url) as conn:
        producers.publish(conn, topic, {"poison": 1}, key="poison", headers={"big": "x" * 200_000},
                          idempotency_key="poison")  # fmt: skip
        for i in range(40):
            producers.publish(conn, topic, {"i": i}, key=f"k{i}", idempotency_key=f"ok-{i}")


def dead_letters(database_url: str) -> list[tuple[str, int]]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT idempotency_key, attempts FROM outbox WHERE state = 'failed'").fetchall()
    return [(str(key), int(attempts)) for key, attempts in rows]


@pytest.mark.usefixtures("broker_refuses_what_the_sink_would_catch")
@pytest.mark.parametrize("where", [0, 5, 9])
def test_a_close_in_refusal_is_traced_to_the_event_that_caused_it(amqp_url: str, where: int) -> None:
    with temp_queue(amqp_url) as queue:
        events = [make_event(queue.name) for _ in range(9)]
        events.insert(where, poison(queue.name))
        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url), events))
        refused = outcomes[where]
        assert isinstance(refused, Failure) and not refused.permanent and not refused.unavailable, outcomes
        assert "refused by RabbitMQ" in refused.error and "501" in refused.error
        assert [o for i, o in enumerate(outcomes) if i != where] == [None] * 9, outcomes
        innocent = {e.idempotency_key for i, e in enumerate(events) if i != where}
        assert {m.message_id for m in queue.collect(9)} == innocent


@pytest.mark.usefixtures("broker_refuses_what_the_sink_would_catch")
def test_two_poisons_in_one_batch_are_both_found(amqp_url: str) -> None:
    with temp_queue(amqp_url) as queue:
        events = [make_event(queue.name) for _ in range(30)]
        events[3], events[21] = poison(queue.name, "poison-a"), poison(queue.name, "poison-b")
        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url), events))
        failed = {events[i].idempotency_key for i, o in enumerate(outcomes) if o is not None}
        assert failed == {"poison-a", "poison-b"}, outcomes
        assert len({m.message_id for m in queue.collect(28)}) == 28


@pytest.mark.usefixtures("broker_refuses_what_the_sink_would_catch")
def test_a_batch_in_flight_beside_the_poison_is_not_blamed(amqp_url: str) -> None:
    with temp_queue(amqp_url) as queue:
        first = [make_event(queue.name) for _ in range(200)]
        second = [make_event(queue.name) for _ in range(20)] + [poison(queue.name)]
        outcomes_first, outcomes_second = asyncio.run(publish_once(make_sink(amqp_url), first, second))
        assert outcomes_first == [None] * 200
        assert outcomes_second[:20] == [None] * 20
        assert isinstance(outcomes_second[20], Failure) and "refused by RabbitMQ" in outcomes_second[20].error
        assert len({m.message_id for m in queue.collect(220)}) == 220


@pytest.mark.usefixtures("broker_refuses_what_the_sink_would_catch")
def test_the_relay_dead_letters_what_the_broker_keeps_refusing_and_delivers_the_rest(
    database_url: str, amqp_url: str
) -> None:
    with temp_queue(amqp_url) as queue:
        write_poison_and_forty(database_url, queue.name)
        with RelayThread(database_url, amqp_url, max_attempts=3):
            wait_until(lambda: outbox_counts(database_url) == {"failed": 1}, timeout=60)
        assert sorted({m.message_id or "" for m in queue.collect(40)}) == sorted(f"ok-{i}" for i in range(40))
    assert dead_letters(database_url) == [("poison", 3)], "each refusal spent one attempt"


def test_no_confirm_at_all_is_a_timeout(amqp_url: str) -> None:
    with TcpProxy.to(amqp_url) as proxy, temp_queue(amqp_url) as queue:
        sink = make_sink(via_proxy(amqp_url, proxy), publish_timeout_seconds=1.0)

        async def scenario() -> None:
            await sink.start()
            try:
                proxy.stall()  # the broker gets the messages; its confirms are held back
                with pytest.raises(SinkTimeout, match="no publisher confirm"):
                    await sink.publish([make_event(queue.name) for _ in range(10)])
                proxy.resume()
            finally:
                await sink.close()

        asyncio.run(scenario())
        assert len(queue.collect(10)) == 10, "the broker stored what it did not confirm in time"


def test_a_confirm_that_never_comes_beside_acknowledged_ones_is_a_timed_out_failure(
    amqp_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    track = Link.track

    def loses_one(link: Link, batch: Batch, index: int) -> None:
        if batch.events[index].idempotency_key != "unconfirmed":
            track(link, batch, index)

    monkeypatch.setattr(Link, "track", loses_one)
    with temp_queue(amqp_url) as queue:
        events = [make_event(queue.name), make_event(queue.name, idempotency_key="unconfirmed"), make_event(queue.name)]
        [outcomes] = asyncio.run(publish_once(make_sink(amqp_url, publish_timeout_seconds=1.0), events))
        assert outcomes[0] is None and outcomes[2] is None
        lost = outcomes[1]
        assert isinstance(lost, Failure) and lost.timed_out and not lost.permanent and not lost.unavailable, lost
