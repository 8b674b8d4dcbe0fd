"""Failing events made visible (issue 41), without I/O: the retrying gauges, the progress line, the loop's
early gauges reading after a retry, and the command line of ``status --topics``, ``retry`` and ``dead --topic``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from relay.events import Event, Failure, Outcome
from relay.loop import Relay
from relay.metrics import OTHER_TOPICS, Metrics
from relay.progress import Progress
from relay.sinks.memory import MemorySink
from relay.store.base import RetryingTopic, Status, is_retrying
from relay.store.memory import MemoryStore
from tests.unit.cli_support import refused
from tests.unit.test_loop import FAST, run_until


def series(metrics: Metrics, name: str) -> dict[str, float]:
    return {
        sample.labels["topic"]: sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def test_retrying_events_are_gauges_by_topic_capped_as_the_topic_counters() -> None:
    metrics = Metrics(max_topics=2)
    topics = [RetryingTopic.counted(f"t{n}", n + 1, 10.0 * n) for n in range(5)]
    metrics.observe_status(Status(9, 0, 0, 0.0, retrying=15, retrying_topics=tuple(topics)))
    # The oldest keep a series each; the rest share one: their sum, and the oldest age among them.
    assert series(metrics, "outbox_relay_retrying") == {"t4": 5, "t3": 4, OTHER_TOPICS: 6}
    assert series(metrics, "outbox_relay_oldest_retrying_age_seconds") == {"t4": 40, "t3": 30, OTHER_TOPICS: 20}
    # A topic whose events stopped retrying loses its series at the next reading.
    metrics.observe_status(Status(9, 0, 0, 0.0, retrying=1, retrying_topics=(topics[0],)))
    assert series(metrics, "outbox_relay_retrying") == {"t0": 1}
    metrics.observe_status(Status(9, 0, 0, 0.0))
    assert series(metrics, "outbox_relay_retrying") == {}
    assert "# TYPE outbox_relay_retrying gauge" in metrics.render().decode()


def test_the_progress_line_says_the_rate_the_backlog_and_the_oldest_age(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="relay.progress")
    progress = Progress(sent=100, now=0.0, interval_seconds=30)
    busy = Status(pending=250, in_flight=10, failed=0, oldest_pending_age_seconds=4.25, retrying=2)
    progress.observe(busy, sent=400, now=10.0)  # too soon
    progress.observe(busy, sent=700, now=40.0)
    progress.observe(busy, sent=700, now=80.0)  # nothing delivered: no line
    progress.observe(busy, sent=760, now=100.0)  # too soon after the idle reading, which started a new window
    progress.observe(busy, sent=760, now=110.0)  # the rate is over that window: the last 30 s
    lines = [r for r in caplog.records if getattr(r, "action", None) == "progress"]
    assert [r.getMessage() for r in lines] == [
        "delivered 600 events in 40 s (15.0/s); backlog 250 pending, oldest 4.2 s, 2 retrying",
        "delivered 60 events in 30 s (2.0/s); backlog 250 pending, oldest 4.2 s, 2 retrying",
    ]
    assert [(r.delivered, r.events_per_second, r.backlog, r.oldest_pending_age_seconds) for r in lines] == [  # type: ignore[attr-defined]
        (600, 15.0, 250, 4.25),
        (60, 2.0, 250, 4.25),
    ]
    assert all(r.levelno == logging.INFO for r in lines)


def _speed_up_gauges(monkeypatch: pytest.MonkeyPatch, *, counts: float, progress: float) -> None:
    monkeypatch.setattr("relay.progress.AGE_INTERVAL_SECONDS", 0.01)
    monkeypatch.setattr("relay.progress.COUNTS_INTERVAL_SECONDS", counts)
    monkeypatch.setattr("relay.progress.PROGRESS_INTERVAL_SECONDS", progress)


def test_a_delivering_relay_logs_progress_and_an_idle_one_does_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="relay.progress")
    _speed_up_gauges(monkeypatch, counts=0.05, progress=0.05)
    store, sink = MemoryStore(), MemorySink()
    relay = Relay(store, sink, FAST)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(relay.run(stop))
        await asyncio.sleep(0.3)  # idle: no line
        idle = len([r for r in caplog.records if getattr(r, "action", None) == "progress"])
        for i in range(30):
            store.insert("t", {"i": i})
        async with asyncio.timeout(5):
            while not [r for r in caplog.records if getattr(r, "action", None) == "progress"]:
                await asyncio.sleep(0.01)
        stop.set()
        await task
        assert idle == 0

    asyncio.run(scenario())
    [line, *_] = [r for r in caplog.records if getattr(r, "action", None) == "progress"]
    assert line.delivered == 30 and line.events_per_second > 0 and line.backlog == 0  # type: ignore[attr-defined]


def test_an_event_put_back_to_retry_shows_in_the_gauges_at_the_next_turn_not_the_next_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _speed_up_gauges(monkeypatch, counts=3600, progress=3600)

    def misrouted(event: Event) -> Outcome:
        return Failure("unroutable: no queue bound for routing key 'nowhere'") if event.topic == "nowhere" else None

    store, sink = MemoryStore(), MemorySink(misrouted)
    relay = Relay(store, sink, replace(FAST, backoff_initial_seconds=60, backoff_max_seconds=60, max_attempts=10))
    failing = store.insert("nowhere", {}, key="k")
    store.insert("orders", {})

    def shown() -> bool:
        return series(relay.metrics, "outbox_relay_retrying") == {"nowhere": 1}

    asyncio.run(run_until(relay, shown, timeout=5))
    status = asyncio.run(store.status(topics=5))
    [topic] = status.retrying_topics
    assert (topic.event_id, topic.attempts) == (failing, 1)
    assert topic.last_error == "unroutable: no queue bound for routing key 'nowhere'"
    assert 50 < topic.next_attempt_in_seconds <= 60 and len(store.rows) == 1


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"state": "pending", "attempts": 0, "lease_expires_at": None}, False),
        ({"state": "pending", "attempts": 1, "lease_expires_at": None}, True),
        ({"state": "pending", "attempts": 1, "lease_expires_at": "in an hour"}, False),
        ({"state": "pending", "attempts": 2, "lease_expires_at": "in an hour"}, True),
        ({"state": "pending", "attempts": 1, "lease_expires_at": "an hour ago"}, True),
        ({"state": "failed", "attempts": 3, "lease_expires_at": None}, False),
        ({"state": "sent", "attempts": 1, "lease_expires_at": None}, False),
        ({"state": "pending", "attempts": 1, "lease_expires_at": "infinity"}, False),  # as text: no datetime holds it
        ({"state": "pending", "attempts": 1, "lease_expires_at": "-infinity"}, True),
    ],
)
def test_inspect_says_whether_an_event_is_retrying(row: dict[str, object], expected: bool) -> None:
    now = datetime.now(UTC)
    times = {"in an hour": now + timedelta(hours=1), "an hour ago": now - timedelta(hours=1)}
    lease = row["lease_expires_at"]
    assert is_retrying({**row, "lease_expires_at": times.get(str(lease), lease)}, now) is expected


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["status", "--topics", "1001"], "--topics: '1001' must be from 0 to 1000"),
        (["status", "--topics", "-1"], "--topics: '-1' must be from 0 to 1000"),
        (["status", "--topics", "ten"], "--topics"),
        (["retry"], "one of the arguments --id --topic --all is required"),
        (["retry", "--id", "1", "--topic", "t"], "not allowed with argument"),
        (["retry", "--topic", ""], "no event has an empty topic"),
        (["retry", "--id", "3", "--id", "4"], "--id is given twice"),
        (["dead", "--topic", ""], "no event has an empty topic"),
        (["dead", "--topic", "a", "--topic", "b"], "--topic is given twice"),
    ],
)
def test_bad_selections_are_refused_on_one_line(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert error in refused(argv, capsys)
