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
from uuid import UUID

import psycopg
import pytest

import producers
from relay.app import RunConfig, build_relay, start
from relay.config import CLAIM_RESERVE_SECONDS, SETTLE_RESERVE_SECONDS, RelaySettings, TableName, parse_sink_url
from relay.events import Event
from relay.loop import Relay
from relay.sinks import publish_grace_seconds
from relay.sources.table import TableSource
from relay.store.adapters import build_admin, build_store
from relay.store.base import Claim, RequeueFilter, Started, Store
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

    def write_run(self, topic: str, attempts: Sequence[int]) -> None:
        """Key k's events, ``i`` 1, 2, ... in id order, each with the attempts history left it."""
        for i, spent in enumerate(attempts, start=1):
            payload = {"key": "k", "i": i}
            if self.mysql:
                conn = mysql_support.connect(self.url, autocommit=True)
                try:
                    idem = producers.publish(conn, topic, payload, key="k")
                finally:
                    conn.close()
                statement = "UPDATE outbox SET attempts = %s WHERE idempotency_key = %s"
                mysql_support.execute(self.url, statement, [spent, idem])
            else:
                with psycopg.connect(self.url) as pg:
                    idem = producers.publish(pg, topic, payload, key="k")
                    pg.execute("UPDATE outbox SET attempts = %s WHERE idempotency_key = %s", [spent, idem])

    def end_lease(self, token: UUID) -> None:
        """End the lease of claim ``token``'s rows a second ago, on the database's clock."""
        if self.mysql:
            statement = (
                "UPDATE outbox SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE claim_token = %s"
            )
            mysql_support.execute(self.url, statement, [str(token)])
        else:
            with psycopg.connect(self.url, autocommit=True) as pg:
                statement = "UPDATE outbox SET lease_expires_at = now() - interval '1 second' WHERE claim_token = %s"
                pg.execute(statement, [token])

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
    late = LateFirstClaim(cast(TableSource, relay.source).store, late_seconds=latest + LATE_BY_SECONDS)
    relay.store = cast(TableSource, relay.source).store = cast(Store, late)
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


# A stale batch whose lease a reaper acted on (issue 36). The relay claims a run of key k and stalls
# past its lease before publishing; another relay's reaper dead-letters the events whose attempts
# reached the limit (history gave k's later events more attempts than its first: requeue, replay, a
# late commit); the relay wakes and must renew. After the dead letters are requeued, the broker's
# log of k must read 1, 2, 3, ... (k:1 may go first on its own), never 1, 4, 2, 3.

MAX_ATTEMPTS = 3
#: How long the first batch's events take to build (a stalled process), past the time a batch may
#: start publishing, shortened here to this so the stall costs little.
STALL_SECONDS = 0.4
LATEST_PUBLISH_START_SECONDS = 0.15


class StalledFirstBatch:
    """The real store, but the first batch stalls once its events are built (after the claim started
    ahead of it, if any, went out and chained on it): meanwhile its lease ends and another relay's
    reaper runs."""

    def __init__(self, store: Store, outbox: Outbox, lease_seconds: float) -> None:
        self._store, self._outbox, self._lease_seconds = store, outbox, lease_seconds
        self.tokens: list[UUID] = []
        #: The tokens of the batches each claim was told it may go on from.
        self.chains: list[set[UUID]] = []
        self.reaped = 0
        self.renewed: list[set[int]] = []

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        started = await self._store.start_claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        if started.rows:
            self.tokens.append(started.token)
            self.chains.append({c.token for c in chain})
        return _Stalling(started, self) if len(self.tokens) == 1 and started.rows else started

    async def past_the_lease(self, claim: Claim) -> None:
        await asyncio.sleep(STALL_SECONDS)
        self._outbox.end_lease(claim.token)
        other = build_store(
            self._outbox.url, TableName.parse("outbox"), owner="another-relay",
            lease_seconds=self._lease_seconds, keep_sent=False, listen=False,
        )  # fmt: skip
        await other.open()
        try:
            self.reaped += await other.reap(max_attempts=MAX_ATTEMPTS)
        finally:
            await other.close()

    async def renew(self, claim: Claim) -> set[int]:
        kept = await self._store.renew(claim)
        self.renewed.append(kept)
        return kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class _Stalling:
    def __init__(self, started: Started, store: StalledFirstBatch) -> None:
        self._started, self._store = started, store
        self.token, self.rows = started.token, started.rows

    def tails(self) -> Claim:
        return self._started.tails()

    async def events(self) -> Claim:
        claim = await self._started.events()
        await self._store.past_the_lease(claim)
        return claim


# On PostgreSQL: MariaDB's renew keeps nothing past the lease in the store conformance suite
# (tests/conformance), and the rest is the loop's, the same on every store.
ISSUE_CASE = (0, 2, 2, 0)  # k:2 and k:3 dead-lettered, k:1 and k:4 still the batch's
CHAINED_CASE = (*ISSUE_CASE, 0, 0, 0, 0)  # and a batch claimed ahead went on with k:5..k:8 meanwhile


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("outbox", "broker", "attempts"),
    [
        ("postgres", "kafka", ISSUE_CASE),
        ("postgres", "rabbitmq", ISSUE_CASE),
        ("postgres", "kafka", CHAINED_CASE),
        ("postgres", "rabbitmq", CHAINED_CASE),
    ],
    ids=["kafka", "rabbitmq", "kafka-chained", "rabbitmq-chained"],
    indirect=["outbox", "broker"],
)
def test_a_stale_batch_sends_nothing_of_a_key_past_what_a_reaper_dead_lettered_meanwhile(
    outbox: Outbox, broker: Broker, attempts: tuple[int, ...]
) -> None:
    outbox.write_run(broker.topic, attempts)
    sink = parse_sink_url(broker.sink_url)
    grace = publish_grace_seconds(sink)
    batch_size = len(ISSUE_CASE)
    settings = RelaySettings(
        batch_size=batch_size,
        max_attempts=MAX_ATTEMPTS,
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
    relay.deliveries.latest_publish_start = LATEST_PUBLISH_START_SECONDS
    store = StalledFirstBatch(cast(TableSource, relay.source).store, outbox, settings.lease_seconds)
    relay.store = cast(TableSource, relay.source).store = cast(Store, store)
    before_dead = attempts.index(MAX_ATTEMPTS - 1)

    async def scenario() -> None:
        await start(relay, 10)
        published = relay.metrics.published.labels(broker.topic)
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        admin = build_admin(outbox.url, TableName.parse("outbox"))
        await admin.open()
        try:
            async with asyncio.timeout(20):
                while published._value.get() < before_dead:  # the key's events before its first dead letter
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)  # anything sent past the dead letters would be sent by now
                assert store.reaped == 2
                assert len(await admin.requeue(RequeueFilter(all=True))) == 2
                while published._value.get() < len(attempts):
                    await asyncio.sleep(0.02)
        finally:
            await admin.close()
            stop.set()
            await task

    asyncio.run(scenario())
    if batch_size < len(attempts):  # the case this is about happened: a claim went on from the stale batch
        assert store.tokens[0] in store.chains[1], (store.tokens, store.chains)
    assert outbox.left() == {}
    by_key = first_copies_by_key(broker.read(len(attempts)))
    assert by_key == {"k": list(range(1, len(attempts) + 1))}, by_key
