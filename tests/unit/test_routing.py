"""Topic routing: route parsing, the routing sink over memory sinks, and the loop with it (no I/O)."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest

from relay.cli import build_parser
from relay.config import AmqpSinkConfig, KafkaSinkConfig, parse_route, resolve_routes, split_routes
from relay.errors import ConfigError, SinkUnavailable
from relay.events import Event, Failure
from relay.health import HealthServer
from relay.loop import Relay
from relay.metrics import Metrics
from relay.sinks import build_router
from relay.sinks.memory import MemorySink
from relay.sinks.routing import Route, RoutingSink
from relay.store.memory import MemoryStore
from tests.unit.test_loop import FAST, run_until

T = TypeVar("T")
CANARY = "s3cr3t-canary"
_ids = itertools.count(1)


def go(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def event(topic: str, key: str | None = None) -> Event:
    n = next(_ids)
    return Event(n, topic, key, b"{}", {}, f"e{n}", 1, datetime.now(UTC))


def router(billing: MemorySink, other: MemorySink, **kw: Any) -> RoutingSink:
    kw.setdefault("outage_initial_seconds", 0.05)
    kw.setdefault("outage_max_seconds", 0.1)
    kw.setdefault("recheck_margin_seconds", 0.05)
    return RoutingSink([Route("billing.*", billing, "billing"), Route("*", other, "other")], **kw)


async def wait_for(done: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not done():
            await asyncio.sleep(0.01)


# Route syntax


def test_a_route_is_a_pattern_and_a_sink_url_split_at_the_first_equals_sign() -> None:
    route = parse_route(f"billing.*=amqp://relay:{CANARY}@rabbit:5672/%2F?exchange=events")
    assert route.pattern == "billing.*"
    assert isinstance(route.sink, AmqpSinkConfig) and route.sink.exchange == "events"
    assert CANARY not in route.label and CANARY not in repr(route)
    assert route.label == "amqp://relay:***@rabbit:5672/%2F?exchange=events"


def test_routes_keep_their_order_and_sink_is_the_catch_all_appended_last() -> None:
    routes = resolve_routes(["billing.*=amqp://h:5672/", "audit=kafka://k:9092"], "kafka://main:9092")
    assert [r.pattern for r in routes] == ["billing.*", "audit", "*"]
    assert isinstance(routes[2].sink, KafkaSinkConfig) and routes[2].sink.bootstrap_servers == "main:9092"
    assert resolve_routes([], "kafka://main:9092") == ()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("billing.*", "use PATTERN=URL"),
        (f"amqp://u:{CANARY}@h:5672/?exchange=x", "use PATTERN=URL"),
        ("=kafka://h:1", "pattern before '=' is empty"),
        ("billing.*=", "has no sink URL"),
        (f"billing.*=redis://u:{CANARY}@h:1", "unknown sink scheme"),
        ("billing.*=kafka://nohostport", "is not host:port"),
        ("bill ing=kafka://h:1", "no whitespace"),
    ],
)
def test_bad_routes_are_one_clear_config_error_without_secrets(text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_routes([text], None)
    message = str(caught.value)
    assert needle in message and CANARY not in message and "\n" not in message


def test_a_route_after_the_catch_all_is_refused() -> None:
    with pytest.raises(ConfigError, match="would never be used"):
        resolve_routes(["*=kafka://a:1", "billing.*=kafka://b:1"], None)
    with pytest.raises(ConfigError, match="--sink comes after the catch-all"):
        resolve_routes(["*=kafka://a:1"], "kafka://b:1")


def test_route_flags_repeat_and_replace_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_ROUTES", "billing.*=kafka://a:1\n  audit=kafka://b:1 ")
    assert split_routes(os.environ["RELAY_ROUTES"]) == ["billing.*=kafka://a:1", "audit=kafka://b:1"]
    parser = build_parser()
    assert parser.parse_args(["run"]).routes == ["billing.*=kafka://a:1", "audit=kafka://b:1"]
    given = parser.parse_args(["run", "--route", "x=kafka://c:1", "--route", "*=kafka://d:1"]).routes
    assert given == ["x=kafka://c:1", "*=kafka://d:1"]
    monkeypatch.delenv("RELAY_ROUTES")
    assert build_parser().parse_args(["run"]).routes is None


def test_no_repr_shows_a_route_password() -> None:
    from relay.app import RunConfig
    from relay.config import RelaySettings, TableName

    routes = resolve_routes(
        [f"billing.*=amqp://u:{CANARY}@h:5672/", f"audit=kafka://h:1?sasl.password={CANARY}"],
        f"kafka://relay:{CANARY}@k:9092",
    )
    config = RunConfig("postgresql://db/x", TableName.parse("outbox"), None, RelaySettings(), routes=routes)
    built = build_router(routes, publish_timeout_seconds=1)
    shown = [repr(config), repr(built), config.describe_sinks(), *built.states(), *(r.label for r in routes)]
    assert not [s for s in shown if CANARY in s], shown


def test_routes_to_the_same_sink_share_one_sink() -> None:
    routes = resolve_routes(["a.*=kafka://k:1", "b.*=kafka://other:1", "c.*=kafka://k:1"], None)
    built = build_router(routes, publish_timeout_seconds=1)
    assert len(built.states()) == 2
    assert built.route("a.x") == built.route("c.y") == "kafka://k:1"
    assert built.route("d") is None


# The routing sink


def test_first_matching_route_wins_and_outcomes_keep_the_batch_order() -> None:
    billing, other = MemorySink(), MemorySink(lambda e: Failure("nope") if e.topic == "orders.bad" else None)
    sink = router(billing, other)
    batch = [event("orders.created"), event("billing.paid"), event("orders.bad"), event("billing.refunded")]
    outcomes = go(sink.publish(batch))
    assert outcomes == [None, None, Failure("nope"), None]
    assert [e.topic for e in billing.delivered] == ["billing.paid", "billing.refunded"]
    assert [e.topic for e in other.attempted] == ["orders.created", "orders.bad"]
    assert sink.route("billing") == "other", "billing.* needs the dot"
    assert sink.route("Billing.paid") == "other", "patterns are case-sensitive"


def test_a_topic_without_a_route_fails_permanently() -> None:
    only = MemorySink()
    sink = RoutingSink([Route("billing.*", only, "billing")])
    outcomes = go(sink.publish([event("billing.paid"), event("orders.created")]))
    assert outcomes[0] is None
    assert outcomes[1] == Failure("no route for topic 'orders.created'", permanent=True)


def test_a_down_sink_holds_back_only_its_own_events_and_comes_back_after_a_backoff() -> None:
    async def scenario() -> None:
        billing, other = MemorySink(), MemorySink()
        sink = router(billing, other)
        await sink.start()
        billing.available = False
        first = await sink.publish([event("billing.paid"), event("orders.created"), event("billing.refunded")])
        assert first[1] is None
        held = first[0]
        assert held is not None and held.unavailable and not held.permanent and first[2] == held
        assert "billing unavailable" in held.error and 0 < held.retry_after_seconds <= 0.25
        assert sink.states() == {"billing": False, "other": True}
        assert sink.down() == {"billing": "memory sink switched off"}
        await sink.check()  # one sink is still up: the relay as a whole is not down

        # While down, the sink is not called at all.
        tried = len(billing.attempted)
        again = await sink.publish([event("billing.paid"), event("orders.shipped")])
        assert again[0] is not None and again[0].unavailable and again[1] is None
        assert len(billing.attempted) == tried

        billing.available = True
        await wait_for(lambda: sink.states()["billing"])
        assert await sink.publish([event("billing.paid")]) == [None]
        assert [e.topic for e in other.delivered] == ["orders.created", "orders.shipped"]
        await sink.close()
        assert billing.closed and other.closed

    go(scenario())


def test_the_router_raises_unavailable_only_when_every_sink_is_down() -> None:
    async def scenario() -> None:
        billing, other = MemorySink(), MemorySink()
        sink = router(billing, other, outage_initial_seconds=5, outage_max_seconds=5)
        await sink.start()
        billing.available = other.available = False
        # Only billing is needed and only billing is found down: the other is
        # not known to be down yet, so the batch comes back as held events.
        only_billing = await sink.publish([event("billing.paid")])
        assert only_billing[0] is not None and only_billing[0].unavailable
        with pytest.raises(SinkUnavailable, match="every sink is down"):
            await sink.publish([event("orders.created")])
        with pytest.raises(SinkUnavailable):
            await sink.publish([event("billing.paid"), event("orders.created")])
        with pytest.raises(SinkUnavailable):
            await sink.check()
        await sink.close()

    go(scenario())


def test_start_goes_ahead_while_some_sinks_answer_and_probes_the_others() -> None:
    async def scenario() -> None:
        billing, other = MemorySink(), MemorySink()
        billing.available = False
        sink = router(billing, other)
        await sink.start()
        assert sink.down() == {"billing": "memory sink switched off"}
        billing.available = True
        await wait_for(lambda: not sink.down())
        other.available = False
        with pytest.raises(SinkUnavailable):
            await RoutingSink([Route("*", other, "other")]).start()
        await sink.close()

    go(scenario())


def test_a_probe_that_dies_of_a_bug_stops_the_next_publish() -> None:
    class Broken(MemorySink):
        starts = 0

        async def start(self) -> None:
            self.starts += 1
            if self.starts == 1:
                raise SinkUnavailable("down at start-up")
            raise RuntimeError("bug in start")

    async def scenario() -> None:
        broken, other = Broken(), MemorySink()
        sink = router(broken, other)
        await sink.start()
        await wait_for(lambda: broken.starts == 2)
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="bug in start"):
            await sink.publish([event("orders.created")])
        await sink.close()

    go(scenario())


def test_check_finds_an_idle_sink_gone_and_readiness_reports_any_down_sink() -> None:
    async def scenario() -> None:
        billing, other = MemorySink(), MemorySink()
        sink = router(billing, other, outage_initial_seconds=5, outage_max_seconds=5)
        relay = Relay(MemoryStore(), sink, FAST)
        health = HealthServer(relay, "127.0.0.1", 0, check_interval_seconds=0)  # each call checks anew
        await sink.start()
        assert not await health.ready(), "ready before the relay has started"
        health.started = True
        assert await health.ready()
        billing.available = False
        assert not await health.ready()
        assert sink.states() == {"billing": False, "other": True}
        await sink.close()

    go(scenario())


def test_sink_up_gauge() -> None:
    billing, other = MemorySink(), MemorySink()
    sink = router(billing, other)
    metrics = Metrics()
    metrics.track_sinks(sink.states)
    # Not up until started: a broker that cannot be reached at start-up reads 0 from the first scrape.
    assert 'outbox_relay_sink_up{sink="billing"} 0.0' in metrics.render().decode()
    billing.available = False

    async def scenario() -> None:
        await sink.start()
        text = metrics.render().decode()
        assert 'outbox_relay_sink_up{sink="billing"} 0.0' in text
        assert 'outbox_relay_sink_up{sink="other"} 1.0' in text
        billing.available = True
        await wait_for(lambda: sink.states()["billing"])
        assert 'outbox_relay_sink_up{sink="billing"} 1.0' in metrics.render().decode()
        await sink.close()

    go(scenario())


# The loop with a routing sink


def test_events_of_a_down_route_wait_without_spending_attempts_while_other_routes_flow() -> None:
    store, billing, other = MemoryStore(), MemorySink(), MemorySink()
    sink = router(billing, other, outage_initial_seconds=0.3, outage_max_seconds=0.3, recheck_margin_seconds=0.1)
    billing.available = False
    store.insert("billing.paid", {"n": 1}, key="acct", idempotency_key="acct-1-billing")
    store.insert("orders.created", {"n": 2}, key="acct", idempotency_key="acct-2-order")
    for i in range(20):
        store.insert("orders.created", {"i": i}, key=f"o{i % 3}" if i % 2 else None, idempotency_key=f"o-{i}")
    relay = Relay(store, sink, FAST)

    def others_done_and_billing_held() -> bool:
        rows = {r.idempotency_key: r for r in store.rows.values()}
        return set(rows) == {"acct-1-billing", "acct-2-order"} and rows["acct-1-billing"].lease_expires_at is None

    go(run_until(relay, others_done_and_billing_held))
    rows = {r.idempotency_key: r for r in store.rows.values()}
    held = rows["acct-1-billing"]
    assert held.state == "pending" and held.attempts == 0
    assert held.deliver_at > store.now(), "released with a delay, not claimed again at once"
    assert rows["acct-2-order"].attempts == 0, "the key's later event never left the table"
    assert "acct-2-order" not in {e.idempotency_key for e in other.attempted}
    assert relay.metrics.failed_attempts._value.get() == 0

    billing.available = True
    # The relay closed its sink when it stopped: the next one gets a new router.
    go(run_until(Relay(store, router(billing, other), FAST), lambda: not store.rows))
    assert [e.idempotency_key for e in billing.delivered] == ["acct-1-billing"]
    assert [e.idempotency_key for e in other.delivered if e.key == "acct"] == ["acct-2-order"]


def test_the_loop_backs_off_as_a_whole_when_every_route_is_down() -> None:
    store, billing, other = MemoryStore(), MemorySink(), MemorySink()
    sink = router(billing, other)
    relay = Relay(store, sink, FAST)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        store.insert("orders.created", {"warm": "up"})
        await wait_for(lambda: not store.rows)
        billing.available = other.available = False
        for i in range(6):
            store.insert("billing.paid" if i % 2 else "orders.created", {"i": i})
        await wait_for(lambda: not sink.states()["other"] and not sink.states()["billing"])
        await asyncio.sleep(0.3)
        assert {r.state for r in store.rows.values()} == {"pending"} and len(store.rows) == 6
        assert relay.metrics.failed_attempts._value.get() == 0
        billing.available = other.available = True
        await wait_for(lambda: not store.rows)
        stop.set()
        await task

    go(scenario())
    assert len(billing.delivered) == 3 and len(other.delivered) == 4
