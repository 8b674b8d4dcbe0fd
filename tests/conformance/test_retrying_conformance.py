"""Failing events made visible (issue 41): retrying events in ``status`` and the gauges, per-topic lag,
``retry`` now and ``dead --topic``, the same on every store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from relay.store.base import Dead, Retry, RetryFilter
from tests.conformance.harness import GRACE, MAX, Harness, run


def fail_once(h: Harness, *idems: str, error: str = "NO_ROUTE", delay: float = 600.0) -> None:
    """Claim the events and put them back to retry after ``delay`` with ``error``, the others released."""
    claim = run(h.store.claim(100, max_attempts=MAX))
    chosen = [e for e in claim.events if e.idempotency_key in idems]
    assert {e.idempotency_key for e in chosen} == set(idems)
    retry = [Retry(e.id, delay, f"{error} {e.idempotency_key}") for e in chosen]
    run(h.store.settle(claim, sent=[], retry=retry, dead=[]))
    run(h.store.release(claim, [e.id for e in claim.events if e not in chosen]))


def test_status_counts_failing_events_per_topic_with_the_first_one_s_last_error(h: Harness) -> None:
    h.insert("orders", {}, key="o1", idempotency_key="o-old")
    h.insert("orders", {}, key="o2", idempotency_key="o-new")
    h.insert("billing", {}, key="b1", idempotency_key="b")
    h.insert("billing", {}, idempotency_key="fresh")  # never tried: pending, not retrying
    h.insert("mail", {}, idempotency_key="dead")  # dead-lettered: not retrying
    fail_once(h, "o-old", "o-new", "b")
    claim = run(h.store.claim(100, max_attempts=MAX))
    dead = [e for e in claim.events if e.idempotency_key == "dead"]
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(e.id, "gone") for e in dead]))
    run(h.store.release(claim, [e.id for e in claim.events if e not in dead]))
    h.created("o-old", 300)
    h.created("b", 100)
    status = run(h.admin.status(topics=10))
    assert status.retrying == 3 and status.failed == 1
    shown = [(t.topic, t.retrying, t.event_id, t.attempts, t.last_error) for t in status.retrying_topics]
    assert shown == [
        ("orders", 2, h.id_of("o-old"), 1, "NO_ROUTE o-old"),
        ("billing", 1, h.id_of("b"), 1, "NO_ROUTE b"),
    ]
    orders, billing = status.retrying_topics
    assert 299 < orders.oldest_age_seconds < 400 and 99 < billing.oldest_age_seconds < 200
    assert 500 < orders.next_attempt_in_seconds <= 600
    assert abs(status.oldest_retrying_age_seconds - orders.oldest_age_seconds) < 5
    assert [t.topic for t in run(h.admin.status(topics=1)).retrying_topics] == ["orders"]
    counted = run(h.admin.status())
    assert counted.retrying_topics == () and counted.topics == ()  # no per-topic pass unless asked
    assert counted.retrying == 3 and 299 < counted.oldest_retrying_age_seconds < 400
    # The relays' gauges: every topic, by count and age.
    gauged = run(h.store.gauges())
    assert gauged.retrying == 3 and sorted((t.topic, t.retrying) for t in gauged.retrying_topics) == [
        ("billing", 1),
        ("orders", 2),
    ]
    assert 299 < gauged.oldest_retrying_age_seconds < 400
    as_json = status.as_dict()
    assert as_json["retrying"] == 3 and as_json["retrying_topics"][0]["last_error"] == "NO_ROUTE o-old"  # type: ignore[index]


def test_an_event_in_flight_again_after_a_failure_is_still_retrying_and_a_first_try_is_not(h: Harness) -> None:
    h.insert("t", {}, idempotency_key="failed-once")
    h.insert("t", {}, idempotency_key="first-try")
    fail_once(h, "failed-once", delay=0)
    h.make_due()
    claim = run(h.store.claim(100, max_attempts=MAX))
    assert {e.idempotency_key for e in claim.events} == {"failed-once", "first-try"}
    status = run(h.admin.status(topics=10))
    assert (status.in_flight, status.retrying) == (2, 1)
    [topic] = status.retrying_topics
    assert (topic.event_id, topic.attempts, topic.next_attempt_in_seconds) == (h.id_of("failed-once"), 2, 0)
    # A relay that died holding a first try: its lease over, the event is retried, and shows so.
    h.expire_leases()
    assert run(h.admin.status()).retrying == 2


def test_retry_now_makes_exactly_the_selected_retrying_events_due_and_keeps_their_attempts(h: Harness) -> None:
    h.insert("orders", {}, key="k1", idempotency_key="o1")
    h.insert("orders", {}, key="k2", idempotency_key="o2")
    h.insert("billing", {}, key="k3", idempotency_key="b")
    fail_once(h, "o1", "o2", "b")
    assert run(h.admin.retry_now(RetryFilter(id=h.id_of("b"), topic="orders"))) == []  # both must match
    assert run(h.admin.retry_now(RetryFilter(topic="mail"))) == []
    assert run(h.store.claim(100, max_attempts=MAX)).events == []  # nothing due yet...
    assert run(h.admin.retry_now(RetryFilter(id=h.id_of("b")))) == [h.id_of("b")]
    assert sorted(run(h.admin.retry_now(RetryFilter(topic="orders")))) == [h.id_of("o1"), h.id_of("o2")]
    claimed = run(h.store.claim(100, max_attempts=MAX)).events
    assert {e.idempotency_key for e in claimed} == {"o1", "o2", "b"}  # ...and now at once
    assert all(e.attempts == 2 for e in claimed)  # one more than before: max-attempts still bounds them


def test_retry_now_all_leaves_what_is_not_retrying(h: Harness) -> None:
    h.insert("t", {}, idempotency_key="scheduled", deliver_at=datetime.now(UTC) + timedelta(hours=1))
    h.insert("t", {}, idempotency_key="dead")
    h.insert("t", {}, idempotency_key="retrying")
    h.insert("t", {}, idempotency_key="in-flight")
    fail_once(h, "retrying")
    claim = run(h.store.claim(100, max_attempts=MAX))
    dead = [e for e in claim.events if e.idempotency_key == "dead"]
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(e.id, "x") for e in dead]))
    for idem in ("scheduled", "dead", "in-flight"):
        assert run(h.admin.retry_now(RetryFilter(id=h.id_of(idem)))) == [], idem
    assert run(h.admin.retry_now(RetryFilter(id=h.id_of("in-flight") + 1000))) == []
    assert run(h.admin.retry_now(RetryFilter(all=True))) == [h.id_of("retrying")]
    assert h.state_of("dead") == "failed" and h.snapshot("in-flight")[1] == 1
    assert h.snapshot("scheduled")[4] > datetime.now(UTC) + timedelta(minutes=50)


def test_status_shows_each_topic_s_backlog_oldest_first_at_most_as_many_as_asked(h: Harness) -> None:
    for topic, count, age in (("slow", 3, 500), ("busy", 5, 50), ("quiet", 1, 5)):
        for n in range(count):
            h.insert(topic, {}, idempotency_key=f"{topic}-{n}")
        h.created(f"{topic}-0", age)
    status = run(h.admin.status(topics=2))
    assert [(t.topic, t.pending) for t in status.topics] == [("slow", 3), ("busy", 5)]
    assert status.topic_count == 3
    assert 499 < status.topics[0].oldest_pending_age_seconds < 600
    assert 49 < status.topics[1].oldest_pending_age_seconds < 150
    claimed = run(h.store.claim(3, max_attempts=MAX)).events  # in flight: no longer pending
    shown = {t.topic: t.pending for t in run(h.admin.status(topics=10)).topics}
    assert sum(shown.values()) == 9 - len(claimed)


def test_dead_lists_one_topic_s_dead_letters_with_topic(h: Harness) -> None:
    for idem, topic in (("a1", "orders"), ("b1", "billing"), ("a2", "orders"), ("pad", "orders ")):
        h.insert(topic, {}, key=idem, idempotency_key=idem)
    claim = run(h.store.claim(100, max_attempts=MAX))
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(e.id, "refused") for e in claim.events]))
    assert [d.idempotency_key for d in run(h.admin.dead(topic="orders"))] == ["a1", "a2"]
    assert [d.idempotency_key for d in run(h.admin.dead(topic="orders "))] == ["pad"]
    assert [d.idempotency_key for d in run(h.admin.dead(topic="billing", limit=5))] == ["b1"]
    assert run(h.admin.dead(topic="mail")) == []
    assert len(run(h.admin.dead())) == 4


def test_a_failed_try_of_an_event_taken_over_is_no_crash_for_the_reaper_of_a_relay_with_fewer_attempts(
    h: Harness,
) -> None:
    # Relay A (--max-attempts 5) stalls with the event; relay B (the same) takes it over and its broker
    # refuses it: a retry. A relay with --max-attempts 2 (a rolling change of the setting, or a restart with
    # it) then runs. B settled the event: no relay holds it, none crashed or stalled with it. Its reaper must
    # leave it, as it leaves an event retried by the relay that claimed it first, and the event keeps B's
    # error; it is tried again, as such an event is.
    h.insert("t", {}, key="k", idempotency_key="e")
    run(h.store.claim(10, max_attempts=5))  # relay A
    h.expire_leases(ago=GRACE + 1)
    b = run(h.store.claim(10, max_attempts=5))  # relay B: attempt 2
    (event,) = b.events
    run(h.store.settle(b, sent=[], retry=[Retry(event.id, 0, "broker said no")], dead=[]))
    h.make_due()
    assert run(h.store.reap(max_attempts=2)) == 0
    assert h.state_of("e") == "pending"
    again = run(h.store.claim(10, max_attempts=2))
    assert [e.idempotency_key for e in again.events] == ["e"]
