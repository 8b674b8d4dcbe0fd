"""The claim started ahead: the next claim reaches the store before this one's events are built,
goes on from this one's keys, and goes back unpublished when the loop stops (no I/O)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from relay.errors import StoreUnavailable
from relay.events import HELD, Event, Outcome
from relay.holds import KeyHolds
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim, Started, chained_keys, tails_of
from relay.store.memory import MemoryStore
from relay.store.postgres.store import _Leased
from tests.unit.test_loop import FAST, run_until

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Lazy:
    """A started claim whose events are built only when asked for, and says when."""

    def __init__(self, store: RecordingStore, claim: Claim) -> None:
        self.store = store
        self.claim = claim
        self.token = claim.token
        self.rows = len(claim.events)

    def tails(self) -> Claim:
        return tails_of(self.token, [(e.id, e.topic, e.key) for e in self.claim.events])

    async def events(self) -> Claim:
        self.store.log.append(("built", self.token))
        return self.claim


class RecordingStore(MemoryStore):
    """Logs each claim started (with the tokens it chains on) and each one built."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, Any]] = []

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        claim = await self.claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        self.log.append(("started", (claim.token, {c.token for c in chain}, len(claim.events))))
        return Lazy(self, claim)


class OrderedSink(MemorySink):
    """Chains keys across batches, as Kafka and RabbitMQ do; slow enough for claims to overlap."""

    chains_keys = True

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        await asyncio.sleep(0.002)
        return await super().publish(events, holds)


def test_the_next_claim_starts_before_this_ones_events_are_built_and_goes_on_from_its_keys() -> None:
    store, sink = RecordingStore(), OrderedSink()
    for i in range(200):
        store.insert("t", {"i": i}, key=f"k{i % 3}")
    settings = replace(FAST, batch_size=10)
    asyncio.run(run_until(Relay(store, sink, settings), lambda: len(sink.delivered) == 200, timeout=20))
    sizes = {entry[0]: entry[2] for kind, entry in store.log if kind == "started"}
    full = 0
    for index, (kind, token) in enumerate(store.log):
        if kind != "built" or sizes[token] < settings.batch_size:
            continue  # a claim that was not full has nothing claimed ahead of it
        # Just before a full claim's events were built, the next claim started, chaining on it.
        previous_kind, previous = store.log[index - 1]
        assert previous_kind == "started" and token in previous[1], store.log[max(0, index - 3) : index + 1]
        full += 1
    assert full >= 15, store.log
    # Every key's events arrived in order, each once.
    for key in ("k0", "k1", "k2"):
        got = [json.loads(e.payload)["i"] for e in sink.delivered if e.key == key]
        assert got == sorted(got), key
    assert sorted(json.loads(e.payload)["i"] for e in sink.delivered) == list(range(200))


def test_tails_stand_for_the_claim_in_a_chain() -> None:
    token = uuid4()
    rows = [(5, "a", "k1"), (3, "a", "k1"), (9, "b", "k1"), (4, "a", "k2"), (6, "a", None), (7, "c", "k3")]
    events = [
        Event(id=i, topic=t, key=k, payload=b"{}", headers={}, idempotency_key=str(i), attempts=1, created_at=NOW)
        for i, t, k in rows
    ]
    full, tails = Claim(token=token, events=events), tails_of(token, rows)
    assert tails.token == token
    assert len(tails.events) == 4  # k1's last and one other, k2's and k3's only event
    other = Claim(token=uuid4(), events=[replace(events[3], id=8), replace(events[5], id=1)])  # k2 and k3 again
    # Alone and beside another batch in flight, the tails give what the whole claim gives.
    for chain in ([full], [full, other], [other, full]):
        tailed = [tails if claim is full else claim for claim in chain]
        expected = {key: (e.id, e.topic) for key, e in chained_keys(chain).items()}
        assert {key: (e.id, e.topic) for key, e in chained_keys(tailed).items()} == expected
    assert {key: e.id for key, e in chained_keys([full, other]).items()} == {"k1": 9, "k2": 8, "k3": 7}


def test_a_key_with_one_event_in_flight_is_chained_only_if_its_batch_marks_it_recurring() -> None:
    events = [
        Event(id=i, topic="t", key=k, payload=b"{}", headers={}, idempotency_key=str(i), attempts=1, created_at=NOW)
        for i, k in ((1, "busy"), (2, "quiet"), (3, "pair"), (4, "pair"), (5, None))
    ]
    claim = Claim(token=uuid4(), events=events)
    assert {key: e.id for key, e in chained_keys([claim]).items()} == {"pair": 4}
    marked = replace(
        claim, recurring=frozenset({"busy", "gone"})
    )  # "gone" has nothing in flight: nothing to go on from
    assert {key: e.id for key, e in chained_keys([marked]).items()} == {"busy": 1, "pair": 4}
    # A mark on one batch of the chain counts for the key's last event in any of them.
    later = Claim(token=uuid4(), events=[replace(events[0], id=7)])
    assert {key: e.id for key, e in chained_keys([marked, later]).items()} == {"busy": 7, "pair": 4}
    assert {key: e.id for key, e in chained_keys([later, marked]).items()} == {"busy": 7, "pair": 4}


def test_as_many_keys_as_a_batch_holds_go_on_from_batch_to_batch_once_they_recur() -> None:
    """One event of each key in each batch: a key that came in the batch before recurs, so the claim
    ahead goes on with it. Without that, every claim ahead found its keys in flight and came back empty."""
    store, sink = RecordingStore(), OrderedSink()
    keys, per_key = 10, 30
    for i in range(keys * per_key):
        store.insert("t", {"i": i}, key=f"k{i % keys}")
    settings = replace(FAST, batch_size=keys)
    total = keys * per_key
    asyncio.run(run_until(Relay(store, sink, settings), lambda: len(sink.delivered) == total, timeout=20))
    sizes = [entry[2] for kind, entry in store.log if kind == "started"]
    assert sum(sizes) == total
    # The first claims ahead meet keys that have not recurred yet, and the last ones find the backlog
    # gone (a few either way on a busy machine); before, every other claim came back empty.
    assert sizes.count(0) <= 8, sizes
    assert len(sizes) <= per_key + 10, sizes
    for key in range(keys):
        got = [json.loads(e.payload)["i"] for e in sink.delivered if e.key == f"k{key}"]
        assert got == sorted(got) and len(got) == per_key, key


def test_a_claim_started_ahead_goes_back_unpublished_when_the_loop_stops() -> None:
    store = RecordingStore()

    class SlowSink(OrderedSink):
        async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
            await asyncio.sleep(0.05)
            return await super().publish(events, holds)

    sink = SlowSink()
    for i in range(500):
        store.insert("t", {"i": i}, key=f"k{i % 5}")
    relay = Relay(store, sink, replace(FAST, batch_size=10))

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        while len(sink.delivered) < 30:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.03)  # the pipeline is full: the loop waits, a claim ahead in hand
        assert relay._ahead is not None
        stop.set()
        await task

    asyncio.run(scenario())
    assert relay._ahead is None
    # Nothing is left leased, and nothing unsent spent an attempt.
    left = list(store.rows.values())
    assert left and all(r.claim_token is None for r in left)
    assert all(r.attempts == 0 for r in left), sorted({r.attempts for r in left})
    assert len(sink.delivered) + len(left) == 500


class RawResult:
    """The few parts of a psycopg cursor and its PGresult that a started PostgreSQL claim reads."""

    def __init__(self, columns: list[str], rows: list[list[bytes | None]]) -> None:
        self._columns = columns
        self.pgresult = self
        self.ntuples = len(rows)
        self.nfields = len(columns)
        self._rows = rows

    def fname(self, column: int) -> bytes:
        return self._columns[column].encode()

    def get_value(self, row: int, column: int) -> bytes | None:
        return self._rows[row][column]


def test_a_started_postgres_claim_reads_its_raw_rows_whatever_their_keys_topics_and_priorities() -> None:
    columns = ["id", "topic", "key", "priority", "snapshot_xmin", "xact_id"]
    rows: list[list[bytes | None]] = [
        [b"-9223372036854775808", b"t", "clé-😀".encode(), b"-5", b"700", b"712"],
        [b"7", None, "clé-😀".encode(), b"0", b"700", b"712"],  # a null topic: an old Debezium view
        [b"3", b"t", None, b"2147483647", b"700", b"712"],
        [b"9", "tópico".encode(), b"k", b"0", b"700", b"712"],
        [b"12", "tópico".encode(), b"k", b"0", b"700", b"712"],
    ]
    leased = _Leased(uuid4(), RawResult(columns, rows), db=None)  # type: ignore[arg-type]
    assert leased.rows == 5 and leased.ids == [-(2**63), 7, 3, 9, 12]
    assert leased.priorities == {-5, 0, 2**31 - 1} and leased.xids == (700, 712)
    tails = {key: (e.id, e.topic) for key, e in chained_keys([leased.tails()]).items()}
    assert tails == {"clé-😀": (7, ""), "k": (12, "tópico")}


class SlowFirstClaimStore(RecordingStore):
    """The first claim comes back too late to publish on its lease, and renewing a lease is slow."""

    def __init__(self, claim_seconds: float, renew_seconds: float) -> None:
        super().__init__()
        self.claim_seconds, self.renew_seconds = claim_seconds, renew_seconds
        self.renewed: list[int] = []

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        started = await super().start_claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        if len(self.log) == 1:
            await asyncio.sleep(self.claim_seconds)
        return started

    async def renew(self, claim: Claim) -> set[int]:
        await asyncio.sleep(self.renew_seconds)
        self.renewed.append(len(claim.events))
        return await super().renew(claim)


def test_a_batch_that_renews_its_lease_is_not_overtaken_by_the_batch_claimed_after_it() -> None:
    # The first claim is slow (a big payload): its batch must renew its lease before publishing.
    # The claim started ahead of it came back at once, fresh, with the next events of the same keys.
    # That batch must wait until the one before it started publishing (or was given back).
    # Renewed in time to publish, or too late (then given back, its keys held).
    for keys, renew_seconds in ((1, 0.01), (1, 0.05), (2, 0.01), (7, 0.05)):
        store, sink = SlowFirstClaimStore(claim_seconds=0.06, renew_seconds=renew_seconds), OrderedSink()
        for i in range(40):
            store.insert("t", {"i": i}, key=f"k{i % keys}")
        relay = Relay(store, sink, replace(FAST, batch_size=8))
        relay.deliveries.latest_publish_start = 0.03  # a lease short enough for the slow claim to outlast
        asyncio.run(run_until(relay, lambda sink=sink: len(sink.delivered) >= 40, timeout=20))  # type: ignore[misc]
        assert store.renewed, "the first batch was expected to renew its lease"
        for k in range(keys):
            got = [json.loads(e.payload)["i"] for e in sink.delivered if e.key == f"k{k}"]
            assert got == sorted(got), (keys, renew_seconds, k, got)
        assert sorted({json.loads(e.payload)["i"] for e in sink.delivered}) == list(range(40))


def test_a_batch_cancelled_before_it_ran_holds_its_keys_and_the_next_batch_does_not_wait_for_ever() -> None:
    async def scenario() -> tuple[Relay, OrderedSink, bool]:
        store, sink = MemoryStore(), OrderedSink()
        for i in range(6):
            store.insert("t", {"i": i}, key="k" if i < 4 else "other")
        relay = Relay(store, sink, replace(FAST, batch_size=2))
        relay._may_claim_ahead = lambda stop: False  # type: ignore[method-assign]  # one batch per call
        stop = asyncio.Event()
        await relay._claim(stop)  # k's first two events; its delivery has not run yet
        (first,) = relay._inflight
        first.cancel()
        await relay._claim(stop)  # k's next two, going on from the first batch
        await relay._claim(stop)  # the other key's
        tasks = set(relay._inflight) | {first}
        _, pending = await asyncio.wait(tasks, timeout=3)
        for task in pending:
            task.cancel()
        return relay, sink, not pending

    relay, sink, finished = asyncio.run(scenario())
    assert finished, "a batch waited for ever for the one cancelled before it"
    # The cancelled batch's key went on hold: its later events were not sent ahead of the first ones.
    assert relay.holds.held("k")
    assert [json.loads(e.payload)["i"] for e in sink.delivered] == [4, 5]


class FirstUnbuiltStore(RecordingStore):
    """Leases as usual, but the first claim's events cannot be built: the database went away meanwhile."""

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        claim = await self.claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        self.log.append(("started", (claim.token, {c.token for c in chain}, len(claim.events))))
        return Unbuilt(self, claim) if len(self.log) == 1 else Lazy(self, claim)


class Unbuilt(Lazy):
    async def events(self) -> Claim:
        raise StoreUnavailable("the connection dropped while the rows were read")


class AnsweringSink(OrderedSink):
    """Notes each batch's outcomes."""

    def __init__(self) -> None:
        super().__init__()
        self.answered: list[list[Outcome]] = []

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        outcomes = await super().publish(events, holds)
        self.answered.append(outcomes)
        return outcomes


def test_a_claim_whose_events_could_not_be_built_holds_its_keys_for_the_claim_started_ahead_of_it() -> None:
    store, sink = FirstUnbuiltStore(), AnsweringSink()
    for i in range(10):
        store.insert("t", {"i": i}, key="k")
    relay = Relay(store, sink, replace(FAST, batch_size=5))
    asyncio.run(run_until(relay, lambda: bool(sink.answered), timeout=5))

    first, ahead = [entry for kind, entry in store.log if kind == "started"][:2]
    assert first[0] in ahead[1], "the second claim was expected to start ahead, going on from the first"
    # The first five stay leased, never published: the next five of their key must not overtake them.
    assert sink.answered[0] == [HELD] * 5 and not sink.delivered
