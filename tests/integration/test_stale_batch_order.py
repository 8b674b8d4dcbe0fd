"""A batch that must renew its lease before publishing is not overtaken by the batch claimed after it.

On real parts: PostgreSQL or MariaDB, to Kafka (Tansu) or RabbitMQ. The answer to the first
claim comes back later than a batch may start publishing on its lease (a stalled process, a
slow network), so its batch renews the lease first, a round trip made slow here. The claim
started ahead of it meanwhile came back at once, fresh, holding the next events of the same
keys: the broker must still get each key's events in order (docs/ordering.md).

The relay has sent each key's earlier events before, as one that has been running has: a Kafka
sink that never saw a key holds a chained event of it instead of sending it (its safety net),
which would hide an overtaking batch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import pytest

import producers
from relay.app import RunConfig, build_relay, publish_grace_seconds, start
from relay.config import CLAIM_RESERVE_SECONDS, SETTLE_RESERVE_SECONDS, RelaySettings, TableName, parse_sink_url
from relay.events import Event
from relay.loop import Relay
from relay.store.base import Claim, Started, Store
from tests import mysql_support
from tests.integration.kafka_support import consume, make_event, unique_topic
from tests.integration.rabbit_support import temp_queue
from tests.relay_support import outbox_counts
from tests.unit.test_loop import run_until

EVENTS = 40
BATCH_SIZE = 8
PUBLISH_TIMEOUT_SECONDS = 2.0
#: How much later than a batch may start publishing on its lease the first claim's answer comes back.
LATE_BY_SECONDS = 0.2
#: A renew's round trip, slowed: the batch claimed after the late one is ready meanwhile.
RENEW_SECONDS = 0.2
#: How long a read-back goes on once all events arrived: a copy would come later, and copies are left out anyway.
READ_SETTLE_SECONDS = 0.1


class LateFirstClaim:
    """The real store, but the answer to its first claim comes back late and each renew is slow.

    The rows of that claim are leased in the database when the answer is held back, as when
    the relay's process stalls or the network is slow on the way back.
    """

    def __init__(self, store: Store, late_seconds: float) -> None:
        self._store = store
        self._late_seconds = late_seconds
        self.claims = 0
        #: How many events each renew kept.
        self.renewed: list[int] = []

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        started = await self._store.start_claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        self.claims += 1
        if self.claims == 1:
            await asyncio.sleep(self._late_seconds)
        return started

    async def renew(self, claim: Claim) -> set[int]:
        await asyncio.sleep(RENEW_SECONDS)
        kept = await self._store.renew(claim)
        self.renewed.append(len(kept))
        return kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def body(i: int, keys: int) -> dict[str, Any]:
    """The payload of the ``i``-th event of a key of ``keys`` taken in turn: its key, and ``i``."""
    return {"key": f"k{i % keys}", "i": i}


def sent_before(topic: str, keys: int) -> list[Event]:
    """One earlier event of each key, ``i`` below 0, as the relay sent them before the outbox filled."""
    return [make_event(topic, key=f"k{i % keys}", payload=json.dumps(body(i, keys)).encode()) for i in range(-keys, 0)]


@dataclass(frozen=True)
class Outbox:
    """A database with an empty outbox table: where the events are written, and what is left."""

    url: str

    @property
    def mysql(self) -> bool:
        return self.url.startswith("mysql")

    def write(self, topic: str, keys: int) -> None:
        """``EVENTS`` events in one transaction, ``i`` 0, 1, ... in id order, spread over ``keys`` keys in turn."""
        events = [(f"k{i % keys}", body(i, keys)) for i in range(EVENTS)]
        if self.mysql:
            conn = mysql_support.connect(self.url, autocommit=False)
            try:
                for key, payload in events:
                    producers.publish(conn, topic, payload, key=key)
                conn.commit()
            finally:
                conn.close()
        else:
            with psycopg.connect(self.url) as pg:
                for key, payload in events:
                    producers.publish(pg, topic, payload, key=key)

    def left(self) -> dict[str, int]:
        """Rows per state."""
        return mysql_support.outbox_counts(self.url) if self.mysql else outbox_counts(self.url)


@pytest.fixture(params=["postgres", "mariadb"])
def outbox(request: pytest.FixtureRequest) -> Outbox:
    return Outbox(request.getfixturevalue("mysql_url" if request.param == "mariadb" else "database_url"))


@dataclass
class Broker:
    """Where the relay sends the events of ``topic``, and how to read them back in the broker's order."""

    sink_url: str
    topic: str
    #: ``read(count)``: the message bodies, each key's in the order the broker keeps them.
    read: Callable[[int], list[bytes]]


@pytest.fixture(params=["kafka", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    if request.param == "kafka":
        bootstrap: str = request.getfixturevalue("kafka_bootstrap")
        topic = unique_topic()

        def read_kafka(count: int) -> list[bytes]:
            received = consume(bootstrap, topic, count=count, settle_seconds=READ_SETTLE_SECONDS)
            # A key's events share a partition: its order there is the order of their offsets.
            return [m.value for m in sorted(received, key=lambda m: (m.partition, m.offset))]

        yield Broker(f"kafka://{bootstrap}", topic, read_kafka)
        return
    amqp_url: str = request.getfixturevalue("amqp_url")
    with temp_queue(amqp_url) as queue:  # the default exchange routes the topic to the queue of that name
        yield Broker(
            amqp_url, queue.name, lambda count: [m.body for m in queue.collect(count, settle=READ_SETTLE_SECONDS)]
        )


def late_first_claim_relay(outbox: Outbox, sink_url: str) -> tuple[Relay, LateFirstClaim]:
    """A relay as ``run`` builds it, on the shortest lease it accepts for the sink, whose first claim
    comes back too late to publish on that lease."""
    sink = parse_sink_url(sink_url)
    grace = publish_grace_seconds(sink)
    settings = RelaySettings(
        batch_size=BATCH_SIZE,
        max_attempts=3,
        backoff_initial_seconds=0.05,
        backoff_max_seconds=0.2,
        lease_seconds=CLAIM_RESERVE_SECONDS + PUBLISH_TIMEOUT_SECONDS + grace + SETTLE_RESERVE_SECONDS,
        publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS,
        poll_interval_seconds=0.05,
        poll_interval_max_seconds=0.2,
        listen=False,
    )
    relay = build_relay(
        RunConfig(database_url=outbox.url, table=TableName.parse("outbox"), sink=sink, settings=settings)
    )
    # On that lease a batch may start publishing at most this long after its claim was sent.
    latest = settings.latest_publish_start_seconds(grace)
    assert latest == CLAIM_RESERVE_SECONDS
    late = LateFirstClaim(relay.store, late_seconds=latest + LATE_BY_SECONDS)
    relay.store = cast(Store, late)
    return relay, late


def first_copies_by_key(bodies: list[bytes]) -> dict[str, list[int]]:
    """Each key's events as the broker keeps them, a copy of one already seen left out."""
    seen: set[int] = set()
    by_key: dict[str, list[int]] = {}
    for raw in bodies:
        event = json.loads(raw)
        if event["i"] not in seen:
            seen.add(event["i"])
            by_key.setdefault(event["key"], []).append(event["i"])
    return by_key


@pytest.mark.timeout(60)
@pytest.mark.parametrize("keys", [1, 3])
def test_a_batch_that_renews_its_lease_reaches_the_broker_before_the_batch_claimed_after_it(
    outbox: Outbox, broker: Broker, keys: int
) -> None:
    outbox.write(broker.topic, keys)
    relay, store = late_first_claim_relay(outbox, broker.sink_url)

    async def relay_everything() -> None:
        await start(relay, 10)
        assert await relay.sink.publish(sent_before(broker.topic, keys), relay.holds) == [None] * keys
        published = relay.metrics.published.labels(broker.topic)
        await run_until(relay, lambda: published._value.get() >= EVENTS, timeout=20)

    asyncio.run(relay_everything())
    # The first batch renewed its lease and kept all its events: the case this test is about happened.
    assert store.renewed[:1] == [BATCH_SIZE], store.renewed
    assert outbox.left() == {}

    by_key = first_copies_by_key(broker.read(keys + EVENTS))
    assert sorted(i for found in by_key.values() for i in found) == list(range(-keys, EVENTS))
    for key, found in by_key.items():
        assert found == sorted(found), (key, found)
