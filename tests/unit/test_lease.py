"""What a lease must hold (claim, publish, the sink's grace, settle), settles within it, and connecting once."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest

from relay import app, cli
from relay.app import RunConfig, start
from relay.config import (
    CLAIM_RESERVE_SECONDS,
    SETTLE_RESERVE_SECONDS,
    RelaySettings,
    TableName,
    parse_sink_url,
    resolve_routes,
)
from relay.errors import ConfigError
from relay.events import Event, Outcome
from relay.holds import KeyHolds
from relay.loop import Relay
from relay.sinks.memory import MemorySink
from relay.store.base import Claim, Dead, Retry, Settlement
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, run_until


class CountingStore(MemoryStore):
    """Counts connections and times claims and settles."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.opens = 0
        self.claimed_at: list[float] = []
        self.settles: list[float] = []

    async def open(self) -> None:
        self.opens += 1
        await super().open()

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        claim = await super().claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        if claim.events:
            self.claimed_at.append(time.monotonic())
        return claim

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        self.settles.append(time.monotonic())
        return await super().settle(claim, sent=sent, retry=retry, dead=dead)


class CountingSink(MemorySink):
    def __init__(self) -> None:
        super().__init__()
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        await super().start()


def test_start_then_run_connects_the_store_and_the_sink_once() -> None:
    store, sink = CountingStore(), CountingSink()
    for i in range(5):
        store.insert("t", {"i": i})
    relay = Relay(store, sink, FAST)

    async def scenario() -> None:
        assert await start(relay, timeout=1.0)
        await run_until(relay, lambda: not store.rows)

    asyncio.run(scenario())
    assert (store.opens, sink.starts) == (1, 1)
    assert len(sink.delivered) == 5


def test_run_alone_connects_too() -> None:
    store, sink = CountingStore(), CountingSink()
    store.insert("t", {})
    asyncio.run(run_until(Relay(store, sink, FAST), lambda: not store.rows))
    assert (store.opens, sink.starts) == (1, 1)


def test_a_settle_is_retried_only_until_the_lease_that_began_at_the_claim_ends() -> None:
    """The publish takes a third of the lease; then the database goes away for good.

    Settles are retried until the lease ends, counted from the claim: not a
    whole lease from the first settle, by when another relay may have sent
    the events again.
    """
    settings = replace(FAST, lease_seconds=3.0, publish_timeout_seconds=0.5)
    store = CountingStore(lease_seconds=settings.lease_seconds)

    class SlowSink(MemorySink):
        async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
            await asyncio.sleep(1.0)
            outcomes = await super().publish(events, holds)
            store.available = False
            return outcomes

    store.insert("t", {})
    relay = Relay(store, SlowSink(), settings)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        await asyncio.sleep(settings.lease_seconds + 1.5)
        stop.set()
        await task

    asyncio.run(scenario())
    [claimed_at] = store.claimed_at
    tries = [round(at - claimed_at, 2) for at in store.settles]
    assert len(tries) >= 3, tries
    assert tries[0] >= 1.0, tries
    # The last try comes as the lease ends, give or take the loop's own latency.
    assert settings.lease_seconds - 0.5 <= tries[-1] <= settings.lease_seconds + 0.25, tries


# What a lease must hold: the claim, the publish and what the sink takes past it, the settle.

KAFKA = "kafka://broker:9092"
RABBITMQ = "amqp://guest:guest@broker:5672/%2F"
GRACE = {KAFKA: 5.0, RABBITMQ: 10.0}


def run_config(lease: float, publish_timeout: float, sink_url: str = KAFKA, routes: Sequence[str] = ()) -> RunConfig:
    settings = RelaySettings(lease_seconds=lease, publish_timeout_seconds=publish_timeout)
    return RunConfig(
        database_url="postgresql://app@db/shop",
        table=TableName.parse("outbox"),
        sink=parse_sink_url(sink_url) if not routes else None,
        routes=resolve_routes(routes, None),
        settings=settings,
    )


def shortest_lease(publish_timeout: float, grace: float) -> float:
    return CLAIM_RESERVE_SECONDS + publish_timeout + grace + SETTLE_RESERVE_SECONDS


@pytest.mark.parametrize("sink_url", [KAFKA, RABBITMQ])
@pytest.mark.parametrize("publish_timeout", [0.5, 3.0, 30.0])
def test_the_lease_must_hold_the_claim_the_publish_the_sinks_grace_and_the_settle(
    sink_url: str, publish_timeout: float
) -> None:
    lease = shortest_lease(publish_timeout, GRACE[sink_url])
    assert run_config(lease, publish_timeout, sink_url).settings.lease_seconds == lease
    # Each term on its own makes it too short: a longer publish timeout, a
    # lease that holds the publish and the grace but not the claim and the
    # settle, or one that holds the publish but not the grace.
    for too_short in (
        (lease, publish_timeout + 0.1),
        (lease - 0.1, publish_timeout),
        (publish_timeout + GRACE[sink_url] + 1.5, publish_timeout),
        (publish_timeout + 2.5, publish_timeout),
    ):
        with pytest.raises(ConfigError, match="--lease-seconds") as refused:
            run_config(*too_short, sink_url)
        message = str(refused.value)
        assert "\n" not in message and f"{shortest_lease(too_short[1], GRACE[sink_url]):g} s" in message, message


def test_rabbitmqs_close_needs_a_longer_lease_than_kafkas_margin() -> None:
    lease = shortest_lease(3.0, GRACE[KAFKA])
    run_config(lease, 3.0, KAFKA)
    with pytest.raises(ConfigError, match="amqp"):
        run_config(lease, 3.0, RABBITMQ)
    # With routes, the slowest sink decides.
    with pytest.raises(ConfigError, match="amqp"):
        run_config(lease, 3.0, routes=[f"billing.*={RABBITMQ}", f"*={KAFKA}"])
    config = run_config(shortest_lease(3.0, GRACE[RABBITMQ]), 3.0, routes=[f"billing.*={RABBITMQ}", f"*={KAFKA}"])
    assert config.publish_grace_seconds == GRACE[RABBITMQ]


def test_run_refuses_a_lease_too_short_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--database-url", "postgresql://app@db/shop", "--sink", KAFKA]
    assert cli.main([*argv, "--lease-seconds", "8", "--publish-timeout", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--lease-seconds 8 is too short" in err and "10 s" in err and len(err.splitlines()) == 1, err


ADVICE = re.compile(r"use at least ([0-9.]+) s")


@pytest.mark.parametrize("sink_url", [KAFKA, RABBITMQ, "routes"])
@pytest.mark.parametrize("lease", ["1", "5", "8", "31.5", "35", "41.9"])
@pytest.mark.parametrize("publish_timeout", [None, "3", "30", "0.3333", "1234567.891", "99.9999"])
def test_the_lease_checks_advice_once_followed_passes(
    capsys: pytest.CaptureFixture[str], sink_url: str, lease: str, publish_timeout: str | None
) -> None:
    """It asked for 32 s at --lease-seconds 5 (the claim, the publish and the settle, not the sink's grace),
    then for 42 s at 32 (RabbitMQ): the first advice is the last."""
    sinks = ["--route", f"billing.*={RABBITMQ}", "--sink", KAFKA] if sink_url == "routes" else ["--sink", sink_url]
    argv = ["run", "--database-url", "postgresql://app@db/shop", *sinks]
    argv += ["--publish-timeout", publish_timeout] if publish_timeout else []
    started: list[RunConfig] = []

    async def serve(config: RunConfig) -> None:
        started.append(config)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app, "serve", serve)
        if cli.main([*argv, "--lease-seconds", lease]) == 0:
            return  # long enough already
        advice = ADVICE.search(capsys.readouterr().err)
        assert advice is not None
        assert cli.main([*argv, "--lease-seconds", advice.group(1)]) == 0, capsys.readouterr().err
    assert len(started) == 1


class SlowClaims(MemoryStore):
    """Claims take ``seconds`` (a busy database, a payload of many megabytes), the first ``times`` of them.

    ``meanwhile`` runs during each slow claim, after the rows were leased: another relay's takeover, say.
    """

    def __init__(self, seconds: float, times: int = 1, meanwhile: Callable[[Claim], None] | None = None, **kw: Any):
        super().__init__(**kw)
        self.seconds, self.times, self.meanwhile = seconds, times, meanwhile
        self.released: list[int] = []
        self.renewed: list[set[int]] = []

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        claim = await super().claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        if claim.events and self.times:
            self.times -= 1
            await asyncio.sleep(self.seconds)
            if self.meanwhile:
                self.meanwhile(claim)
        return claim

    async def renew(self, claim: Claim) -> set[int]:
        kept = await super().renew(claim)
        self.renewed.append(kept)
        for i in kept:  # the lease runs from now again
            lease_left = (self.rows[i].lease_expires_at - self.now()).total_seconds()  # type: ignore[operator]
            assert self.lease_seconds - 0.5 < lease_left <= self.lease_seconds
        return kept

    async def release(self, claim: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        self.released.extend(ids)
        await super().release(claim, ids, delay_seconds=delay_seconds)


@pytest.mark.parametrize(
    ("grace", "claim_seconds"),
    [
        # Past lease - timeout - settle: the settle might not fit any more.
        (0.0, 2.0),
        # Past lease - timeout - grace - settle: the sink's grace might not fit.
        (2.0, 1.8),
    ],
)
def test_a_batch_claimed_too_late_in_its_lease_renews_it_and_goes_out_once(grace: float, claim_seconds: float) -> None:
    settings = replace(FAST, lease_seconds=3.0 + grace, publish_timeout_seconds=0.5)
    assert claim_seconds > settings.latest_publish_start_seconds(grace)
    store, sink = SlowClaims(claim_seconds, lease_seconds=settings.lease_seconds), MemorySink()
    store.insert("t", {}, idempotency_key="late")
    relay = Relay(store, sink, settings, publish_grace_seconds=grace)
    asyncio.run(run_until(relay, lambda: not store.rows, timeout=claim_seconds + 3))
    assert store.renewed == [{1}] and store.released == []
    assert [e.idempotency_key for e in sink.delivered] == ["late"]
    assert sink.delivered[0].attempts == 1


@pytest.mark.parametrize("keys", [["k"] * 6, ["a", "b", "a", None, "b", "a"], [None] * 3])
def test_claims_that_are_always_slower_than_the_lease_allows_never_stall_the_relay(keys: list[str | None]) -> None:
    # Giving such a batch back would stall it for good: the next claim takes as long.
    settings = replace(FAST, batch_size=2, lease_seconds=3.0, publish_timeout_seconds=0.5)
    store, sink = SlowClaims(1.8, times=10**6, lease_seconds=settings.lease_seconds), MemorySink()
    assert store.seconds > settings.latest_publish_start_seconds()
    for n, key in enumerate(keys):
        store.insert("t", {"n": n}, key=key)
    asyncio.run(run_until(Relay(store, sink, settings), lambda: not store.rows, timeout=3 * len(keys)))
    assert sorted(e.id for e in sink.delivered) == list(range(1, len(keys) + 1))
    assert all(e.attempts == 1 for e in sink.delivered) and store.released == []
    for key in set(keys) - {None}:
        ids = [e.id for e in sink.delivered if e.key == key]
        assert ids == sorted(ids)


def test_a_stale_batch_publishes_none_of_what_another_relay_took_over_and_holds_its_key() -> None:
    settings = replace(FAST, lease_seconds=3.0, publish_timeout_seconds=0.5)
    other = uuid4()

    def take_over_the_first(claim: Claim) -> None:  # another relay claims it after the lease lapsed
        row = store.rows[claim.events[0].id]
        row.claim_token, row.lease_expires_at = other, store.now() + timedelta(seconds=60)

    store, sink = SlowClaims(2.0, meanwhile=take_over_the_first, lease_seconds=3.0), MemorySink()
    store.insert("t", {}, key="a", idempotency_key="a1")
    store.insert("t", {}, key="a", idempotency_key="a2")
    store.insert("t", {}, key="b", idempotency_key="b1")
    relay = Relay(store, sink, settings)
    asyncio.run(run_until(relay, lambda: 3 not in store.rows and store.rows[2].claim_token is None, timeout=6))
    assert store.renewed == [{2, 3}]
    assert [e.idempotency_key for e in sink.delivered] == ["b1"], "a2 went out while a1 was another relay's"
    assert store.rows[1].claim_token == other and store.released == [2]
    assert store.rows[2].attempts == 0, "a2 was held, not tried"
