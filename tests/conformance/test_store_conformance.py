"""One suite, every store: the in-memory store must behave like PostgreSQL.

Each test runs against ``MemoryStore`` and against ``PostgresStore`` on a real
database (tests/conformance/harness.py), so unit tests of the relay loop on the
memory store say something true about production. The operator's commands
have their own file, test_admin_conformance.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from relay.store.base import Claim, Dead, RequeueFilter, Retry, Skipped
from tests.conformance.harness import GRACE, MAX, Harness, run


def test_claims_due_events_by_priority_then_id_up_to_the_limit(h: Harness) -> None:
    for i in range(5):
        h.insert("t", {"i": i}, idempotency_key=f"e{i}", priority=1 if i == 3 else 0)
    claim = run(h.store.claim(3, max_attempts=MAX))
    assert [e.idempotency_key for e in claim.events] == ["e3", "e0", "e1"]
    assert all(e.attempts == 1 for e in claim.events)
    rest = run(h.store.claim(10, max_attempts=MAX))
    assert [e.idempotency_key for e in rest.events] == ["e2", "e4"]


def test_future_deliver_at_is_not_claimed(h: Harness) -> None:
    h.insert("t", {}, idempotency_key="later", deliver_at=datetime.now(UTC) + timedelta(hours=1))
    h.insert("t", {}, idempotency_key="now")
    assert [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX)).events] == ["now"]


def keys_of(claim: Claim) -> list[tuple[str, bool]]:
    return [(e.idempotency_key, e.chained) for e in claim.events]


def test_a_key_comes_as_a_run_in_id_order_and_waits_while_it_is_in_flight(h: Harness) -> None:
    for i in range(3):
        h.insert("t", {"i": i}, key="order-1", idempotency_key=f"k{i}")
    h.insert("t", {}, idempotency_key="free-1")
    h.insert("t", {}, idempotency_key="free-2")
    first = run(h.store.claim(10, max_attempts=MAX))
    assert keys_of(first) == [("k0", False), ("k1", True), ("k2", True), ("free-1", False), ("free-2", False)]
    h.insert("t", {"i": 3}, key="order-1", idempotency_key="k3")
    # Another relay (or one whose sink cannot chain) waits for the key's events in flight.
    assert run(h.store.claim(10, max_attempts=MAX)).events == []
    run(h.store.settle(first, sent=[e.id for e in first.events], retry=[], dead=[]))
    assert keys_of(run(h.store.claim(10, max_attempts=MAX))) == [("k3", False)]


def test_a_relay_goes_on_with_a_key_it_has_in_flight_and_marks_the_events_chained(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="k0")
    h.insert("t", {}, key="k", idempotency_key="k1")
    first = run(h.store.claim(10, max_attempts=MAX))
    h.insert("t", {}, key="k", idempotency_key="k2")
    h.insert("t", {}, key="other", idempotency_key="o0")
    second = run(h.store.claim(10, max_attempts=MAX, chain=[first]))
    assert keys_of(second) == [("k2", True), ("o0", False)]
    # The chain follows live leases only: once they expire, a key waits rather than go on from them
    # (a key with one event in flight is not chained at all: it starts again from its oldest) ...
    h.insert("t", {}, key="k", idempotency_key="k3")
    h.expire_leases()
    assert keys_of(run(h.store.claim(10, max_attempts=MAX, chain=[first, second]))) == [("o0", False)]
    # ... and a claim that no longer counts them starts each key again from its oldest event.
    third = run(h.store.claim(10, max_attempts=MAX))
    assert keys_of(third) == [("k0", False), ("k1", True), ("k2", True), ("k3", True)]


def test_a_key_with_one_event_in_flight_goes_on_when_its_batch_marks_it_recurring(h: Harness) -> None:
    h.insert("t", {}, key="busy", idempotency_key="b0")
    h.insert("t", {}, key="quiet", idempotency_key="q0")
    first = run(h.store.claim(10, max_attempts=MAX))
    h.insert("t", {}, key="busy", idempotency_key="b1")
    h.insert("t", {}, key="quiet", idempotency_key="q1")
    # Unmarked, neither key goes on from its one event in flight ...
    assert run(h.store.claim(10, max_attempts=MAX, chain=[first])).events == []
    # ... marked, "busy" does, after its tail, chained; "quiet" still waits.
    marked = replace(first, recurring=frozenset({"busy"}))
    assert keys_of(run(h.store.claim(10, max_attempts=MAX, chain=[marked]))) == [("b1", True)]


def test_a_key_in_flight_goes_on_after_its_tail_whatever_came_back_before_it(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="k0")
    h.insert("t", {}, key="k", idempotency_key="k1")
    first = run(h.store.claim(10, max_attempts=MAX))
    h.insert("t", {}, key="k", idempotency_key="k2")
    h.insert("t", {}, key="k", idempotency_key="k3")
    second = run(h.store.claim(10, max_attempts=MAX, chain=[first]))
    assert keys_of(first) == [("k0", False), ("k1", True)] and keys_of(second) == [("k2", True), ("k3", True)]
    # k0 comes back for a retry while k2 and k3 are still in flight: the next run of k is chained on
    # k3 all the same, without a look at the key's oldest event (the sink holds k: relay/holds.py) ...
    run(h.store.settle(first, sent=[first.events[1].id], retry=[Retry(first.events[0].id, 3600, "boom")], dead=[]))
    h.insert("t", {}, key="k", idempotency_key="k4")
    h.insert("t", {}, key="other", idempotency_key="o0")
    assert keys_of(run(h.store.claim(10, max_attempts=MAX, chain=[second]))) == [("k4", True), ("o0", False)]
    # ... while a claim that does not have k in flight finds it parked behind its retry.
    h.insert("t", {}, key="k", idempotency_key="k5")
    assert run(h.store.claim(10, max_attempts=MAX)).events == []


def test_a_run_ends_where_its_key_changes_topic_or_an_event_is_not_due(h: Harness) -> None:
    h.insert("a", {}, key="k", idempotency_key="a0")
    h.insert("a", {}, key="k", idempotency_key="a1")
    h.insert("b", {}, key="k", idempotency_key="b0")
    h.insert("a", {}, key="k", idempotency_key="a2")
    h.insert("a", {}, key="j", idempotency_key="j0")
    h.insert("a", {}, key="j", idempotency_key="j1", deliver_at=datetime.now(UTC) + timedelta(hours=1))
    h.insert("a", {}, key="j", idempotency_key="j2")
    first = run(h.store.claim(10, max_attempts=MAX))
    assert keys_of(first) == [("a0", False), ("a1", True), ("j0", False)]
    # Chaining would send b0 while a1 may still fail: the key waits for its other topic's flight to land.
    assert run(h.store.claim(10, max_attempts=MAX, chain=[first])).events == []
    run(h.store.settle(first, sent=[e.id for e in first.events], retry=[], dead=[]))
    assert keys_of(run(h.store.claim(10, max_attempts=MAX))) == [("b0", False)]


def test_a_run_cut_by_the_limit_or_the_byte_cap_keeps_its_first_events(h: Harness) -> None:
    for i in range(5):
        h.insert("t", {"pad": "x" * 100}, key="k", idempotency_key=f"k{i}")
    assert keys_of(run(h.store.claim(3, max_attempts=MAX))) == [("k0", False), ("k1", True), ("k2", True)]
    h.expire_leases()
    capped = run(h.store.claim(10, max_attempts=MAX, max_bytes=250))
    assert [e.idempotency_key for e in capped.events] == ["k0", "k1", "k2"]


def test_priority_puts_unkeyed_events_first_but_never_reorders_a_key(h: Harness) -> None:
    h.insert("t", {}, idempotency_key="low")
    h.insert("t", {}, key="k", idempotency_key="k-first")
    h.insert("t", {}, key="k", idempotency_key="k-second", priority=9)
    h.insert("t", {}, idempotency_key="urgent", priority=9)
    first = run(h.store.claim(1, max_attempts=MAX))
    assert [e.idempotency_key for e in first.events] == ["urgent"]
    second = run(h.store.claim(10, max_attempts=MAX))
    assert [e.idempotency_key for e in second.events] == ["low", "k-first"]
    # k-second outranks k-first, yet waits until k-first is sent.
    assert run(h.store.claim(10, max_attempts=MAX)).events == []
    for claim in (first, second):
        run(h.store.settle(claim, sent=[e.id for e in claim.events], retry=[], dead=[]))
    assert [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX)).events] == ["k-second"]


def test_two_claims_never_share_an_event(h: Harness) -> None:
    for i in range(20):
        h.insert("t", {"i": i}, key=f"k{i % 7}" if i % 2 else None)
    a = run(h.store.claim(10, max_attempts=MAX))
    b = run(h.store.claim(10, max_attempts=MAX))
    assert a.events and b.events
    assert not {e.id for e in a.events} & {e.id for e in b.events}


def taken_over(h: Harness) -> tuple[Claim, Claim]:
    """Event "x" claimed, its lease expired, and claimed again: the stale claim and the new one."""
    h.insert("t", {}, idempotency_key="x")
    old = run(h.store.claim(10, max_attempts=MAX))
    h.expire_leases()
    return old, run(h.store.claim(10, max_attempts=MAX))


def test_settle_with_a_stale_token_changes_nothing(h: Harness) -> None:
    old, new = taken_over(h)
    assert new.reaped == 1 and new.events[0].attempts == 2
    result = run(h.store.settle(old, sent=[old.events[0].id], retry=[], dead=[]))
    assert result.sent == 0 and result.lost == 1
    assert h.state_of("x") == "pending"
    assert run(h.store.settle(new, sent=[new.events[0].id], retry=[], dead=[])).sent == 1
    assert h.state_of("x") is None


def test_a_lease_that_expires_on_its_last_attempt_is_dead_lettered_and_parks_its_key(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="poison")
    for _ in range(MAX):
        assert [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX)).events] == ["poison"]
        h.expire_leases()
    h.insert("t", {}, key="k", idempotency_key="after")
    assert run(h.store.claim(10, max_attempts=MAX)).events == []
    assert run(h.store.reap(max_attempts=MAX)) == 1
    assert h.state_of("poison") == "failed"
    dead = run(h.admin.dead())
    assert [(d.key, d.blocked_events) for d in dead] == [("k", 1)]
    assert "crashed or stalled" in (dead[0].last_error or "")
    assert run(h.store.claim(10, max_attempts=MAX)).events == []
    assert run(h.store.status()).parked_keys == 1


def test_retry_waits_and_holds_back_later_events_of_its_key(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="first")
    h.insert("t", {}, key="k", idempotency_key="second")
    claim = run(h.store.claim(10, max_attempts=MAX))
    run(h.store.settle(claim, sent=[], retry=[Retry(claim.events[0].id, 3600, "boom")], dead=[]))
    assert run(h.store.claim(10, max_attempts=MAX)).events == []
    assert h.state_of("first") == "pending"


def test_retry_with_no_delay_is_claimed_again_with_the_attempt_counted(h: Harness) -> None:
    h.insert("t", {}, idempotency_key="again")
    claim = run(h.store.claim(10, max_attempts=MAX))
    run(h.store.settle(claim, sent=[], retry=[Retry(claim.events[0].id, 0, "boom")], dead=[]))
    again = run(h.store.claim(10, max_attempts=MAX))
    assert [(e.idempotency_key, e.attempts) for e in again.events] == [("again", 2)]
    assert again.reaped == 0


def test_dead_letter_then_skip_releases_the_key(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="bad")
    h.insert("t", {}, key="k", idempotency_key="good")
    claim = run(h.store.claim(10, max_attempts=MAX))
    assert keys_of(claim) == [("bad", False), ("good", True)]
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(claim.events[0].id, "too large")]))
    run(h.store.release(claim, [claim.events[1].id]))  # held back: its key's earlier event failed
    assert run(h.store.claim(10, max_attempts=MAX)).events == []
    assert run(h.admin.skip(claim.events[0].id, lease_grace_seconds=GRACE)) is Skipped.SKIPPED
    assert h.state_of("bad") == "skipped"
    assert [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX)).events] == ["good"]


def test_requeue_resets_attempts_and_delivers_in_key_order(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="bad")
    h.insert("t", {}, key="k", idempotency_key="good")
    claim = run(h.store.claim(10, max_attempts=MAX))
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(claim.events[0].id, "unroutable")]))
    assert run(h.admin.requeue(RequeueFilter(key="k"))) == [claim.events[0].id]
    again = run(h.store.claim(10, max_attempts=MAX))
    assert [(e.idempotency_key, e.attempts) for e in again.events] == [("bad", 1)]


def test_release_gives_events_back_without_an_attempt(h: Harness) -> None:
    h.insert("t", {}, idempotency_key="r")
    claim = run(h.store.claim(10, max_attempts=MAX))
    run(h.store.release(claim, [claim.events[0].id]))
    again = run(h.store.claim(10, max_attempts=MAX))
    assert [(e.idempotency_key, e.attempts) for e in again.events] == [("r", 1)]


def test_release_with_a_delay_waits_keeps_its_place_in_its_key_and_spends_no_attempt(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="first")
    h.insert("t", {}, key="k", idempotency_key="second")
    h.insert("t", {}, idempotency_key="free")
    claim = run(h.store.claim(10, max_attempts=MAX))
    by_idem = {e.idempotency_key: e for e in claim.events}
    assert sorted(by_idem) == ["first", "free", "second"]
    run(h.store.settle(claim, sent=[by_idem["free"].id], retry=[], dead=[]))
    run(h.store.release(claim, [by_idem["first"].id], delay_seconds=3600))
    run(h.store.release(claim, [by_idem["second"].id]))
    # Not due yet, and the key's later event waits behind it.
    assert run(h.store.claim(10, max_attempts=MAX)).events == []
    status = run(h.store.status())
    assert (status.pending, status.in_flight, status.failed) == (2, 0, 0)
    h.make_due()
    again = run(h.store.claim(10, max_attempts=MAX))
    assert [(e.idempotency_key, e.attempts) for e in again.events] == [("first", 1), ("second", 1)]


def test_release_with_a_stale_token_changes_nothing(h: Harness) -> None:
    old, new = taken_over(h)
    run(h.store.release(old, [old.events[0].id], delay_seconds=3600))
    assert run(h.store.status()).in_flight == 1
    assert run(h.store.settle(new, sent=[new.events[0].id], retry=[], dead=[])).sent == 1


@pytest.mark.parametrize("outcome", ["retry", "dead"])
def test_a_retry_or_dead_letter_with_a_stale_token_changes_nothing(h: Harness, outcome: str) -> None:
    old, new = taken_over(h)
    before = h.snapshot("x")
    stale = old.events[0].id
    retry = [Retry(stale, 3600, "stale")] if outcome == "retry" else []
    dead = [Dead(stale, "stale")] if outcome == "dead" else []
    result = run(h.store.settle(old, sent=[], retry=retry, dead=dead))
    assert (result.retried, result.dead, result.lost) == (0, 0, 1)
    # Still leased to the new claim, due when it was, no error recorded, not dead-lettered.
    assert h.snapshot("x") == before
    assert run(h.admin.dead()) == []
    assert run(h.store.settle(new, sent=[new.events[0].id], retry=[], dead=[])).sent == 1


def test_status_counts_pending_in_flight_and_failed(h: Harness) -> None:
    for i in range(4):
        h.insert("t", {}, idempotency_key=f"s{i}")
    claim = run(h.store.claim(2, max_attempts=MAX))
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(claim.events[0].id, "x")]))
    status = run(h.store.status())
    assert (status.pending, status.in_flight, status.failed) == (2, 1, 1)
    assert status.oldest_pending_age_seconds >= 0
    assert run(h.store.claim(10, max_attempts=MAX)).events


def test_the_oldest_pending_age_is_0_while_every_event_is_in_flight(h: Harness) -> None:
    for i in range(2):
        h.insert("t", {}, idempotency_key=f"a{i}")
    run(h.store.claim(10, max_attempts=MAX))
    status = run(h.store.status())
    assert (status.pending, status.in_flight, status.oldest_pending_age_seconds) == (0, 2, 0)
    assert run(h.store.oldest_pending_age()) == 0
    h.expire_leases()  # pending again: aged again
    status = run(h.store.status())
    assert (status.pending, status.in_flight) == (2, 0) and status.oldest_pending_age_seconds > 0


def test_gauges_on_a_small_table_are_the_status_counts(h: Harness) -> None:
    for i in range(6):
        h.insert("t", {}, key=f"k{i % 2}" if i % 3 else None, idempotency_key=f"g{i}")
    claim = run(h.store.claim(3, max_attempts=MAX))
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(claim.events[-1].id, "x")]))
    exact, cheap = run(h.store.status()), run(h.store.gauges())
    assert (cheap.pending, cheap.in_flight, cheap.failed, cheap.parked_keys) == (
        exact.pending,
        exact.in_flight,
        exact.failed,
        exact.parked_keys,
    )
    assert cheap.oldest_pending_age_seconds == pytest.approx(exact.oldest_pending_age_seconds, abs=1.0)


def test_payload_and_headers_survive_the_round_trip(h: Harness) -> None:
    h.insert("t", {"a": [1, "é"], "b": None}, headers={"h": "v"}, idempotency_key="p")
    event = run(h.store.claim(1, max_attempts=MAX)).events[0]

    assert json.loads(event.payload) == {"a": [1, "é"], "b": None}
    assert event.headers == {"h": "v"}
    assert event.message_headers() == {"h": "v", "idempotency-key": "p"}


def test_a_bytes_payload_comes_out_as_it_went_in_with_its_content_type(h: Harness) -> None:
    not_utf8 = bytes(range(256)) + b"\xc3\x28"
    h.insert("t", not_utf8, key="k", content_type="application/x-protobuf", idempotency_key="pb")
    h.insert("t", b"", key="k", idempotency_key="empty")  # content_type defaults to application/octet-stream
    h.insert("t", {"json": True}, key="k", idempotency_key="json")
    events = run(h.store.claim(10, max_attempts=MAX)).events

    assert [(e.idempotency_key, e.payload, e.content_type) for e in events] == [
        ("pb", not_utf8, "application/x-protobuf"),
        ("empty", b"", "application/octet-stream"),
        ("json", b'{"json": true}', None),
    ]


def test_a_bytes_payload_counts_its_length_against_max_bytes(h: Harness) -> None:
    for i in range(3):
        h.insert("t", b"\x01" * 600, idempotency_key=f"b{i}")
    claim = run(h.store.claim(10, max_attempts=MAX, max_bytes=1000))
    assert [e.idempotency_key for e in claim.events] == ["b0", "b1"]


def test_status_and_gauges_show_scheduled_events_and_the_keys_waiting_behind_them(h: Harness) -> None:
    far, soon = datetime(9999, 12, 31, tzinfo=UTC), datetime.now(UTC) + timedelta(hours=1)
    h.insert("t", {}, key="k", idempotency_key="far", deliver_at=far)
    h.insert("t", {}, key="k", idempotency_key="behind-far")  # due, but its key waits for "far"
    h.insert("t", {}, key="j", idempotency_key="later", deliver_at=soon)  # nothing behind it
    h.insert("t", {}, idempotency_key="free-later", deliver_at=soon)
    h.insert("t", {}, key="m", idempotency_key="due")
    assert [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX)).events] == ["due"]
    for status in (run(h.store.status()), run(h.store.gauges())):
        assert (status.pending, status.in_flight, status.failed, status.parked_keys) == (4, 1, 0, 0)
        assert (status.scheduled, status.keys_waiting_on_schedule) == (3, 1)
        assert status.oldest_pending_age_seconds > 0  # "behind-far" is due and waiting
        shown = status.as_dict()
        assert (shown["scheduled"], shown["keys_waiting_on_schedule"]) == (3, 1)
    h.make_due()
    status = run(h.store.status())
    assert (status.scheduled, status.keys_waiting_on_schedule) == (0, 0)


def payload_of(size: int) -> dict[str, str]:
    """A payload whose JSON text is exactly ``size`` bytes, in either store: {"s": "x..."}."""
    return {"s": "x" * (size - 9)}


@pytest.mark.parametrize(
    ("sizes", "max_bytes", "claimed"),
    [
        ([1009] * 5, 2500, 3),  # 0, 1009 and 2018 bytes in hand when each was added; 3027 reaches the cap
        ([1009] * 5, 2018, 2),  # reaching the cap exactly stops the batch
        ([1009] * 5, 1, 1),  # always one event, however large
        ([100, 5000, 100], 1000, 2),  # one large payload may take the batch past the cap
        ([300_000] * 5, 500_000, 2),  # compressible payloads count by their text, not their stored size
        ([1009] * 5, 10**9, 5),
        ([1009] * 5, None, 5),
    ],
)
def test_a_claim_stops_adding_events_once_their_payloads_reach_max_bytes(
    h: Harness, sizes: list[int], max_bytes: int | None, claimed: int
) -> None:
    for i, size in enumerate(sizes):
        h.insert("t", payload_of(size), idempotency_key=f"b{i}")
    claim = run(h.store.claim(10, max_attempts=MAX, max_bytes=max_bytes))
    assert [len(e.payload) for e in claim.events] == sizes[:claimed]
    assert [e.idempotency_key for e in claim.events] == [f"b{i}" for i in range(claimed)]
    rest = run(h.store.claim(10, max_attempts=MAX))
    assert len(rest.events) == len(sizes) - claimed  # the events left out are still there, unleased


def big_headers() -> dict[str, str]:
    """Headers of about a thousand bytes as JSON text (each store measures them its own way, within a few bytes)."""
    return {"h": "x" * 1000}


@pytest.mark.parametrize(("max_bytes", "claimed"), [(2500, 3), (1, 1), (None, 5)])
def test_headers_count_toward_max_bytes_as_payloads_do(h: Harness, max_bytes: int | None, claimed: int) -> None:
    # Small payloads with big headers (plain SQL may write any): the cap counts what the relay holds.
    for i in range(5):
        h.insert("t", {}, headers=big_headers(), idempotency_key=f"b{i}")
    claim = run(h.store.claim(10, max_attempts=MAX, max_bytes=max_bytes))
    assert [e.idempotency_key for e in claim.events] == [f"b{i}" for i in range(claimed)]
    assert all(e.headers == big_headers() for e in claim.events)
    rest = run(h.store.claim(10, max_attempts=MAX))
    assert len(rest.events) == 5 - claimed  # the events left out are still there, unleased


def test_a_run_with_big_headers_is_cut_by_the_byte_cap_never_holed(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="k0")
    h.insert("t", {}, headers=big_headers(), idempotency_key="free")
    h.insert("t", {}, key="k", idempotency_key="k1")
    h.insert("t", {}, key="k", headers=big_headers(), idempotency_key="k2")
    h.insert("t", {}, key="k", idempotency_key="k3")
    first = run(h.store.claim(10, max_attempts=MAX, max_bytes=1000))
    # "free" takes the batch to the cap: k1 and the rest of the run wait, though k1's headers are empty.
    assert keys_of(first) == [("k0", False), ("free", False)]
    run(h.store.settle(first, sent=[e.id for e in first.events], retry=[], dead=[]))
    second = run(h.store.claim(10, max_attempts=MAX, max_bytes=1000))
    # k2's headers reach the cap once it is in: the run stops there, and k3 waits for the next claim.
    assert keys_of(second) == [("k1", False), ("k2", True)]
    run(h.store.settle(second, sent=[e.id for e in second.events], retry=[], dead=[]))
    assert keys_of(run(h.store.claim(10, max_attempts=MAX, max_bytes=1000))) == [("k3", False)]


def test_the_byte_cap_follows_priority_order_and_the_count_still_applies(h: Harness) -> None:
    h.insert("t", payload_of(1000), idempotency_key="low")
    h.insert("t", payload_of(1000), idempotency_key="high", priority=5)
    h.insert("t", payload_of(10), idempotency_key="small")
    h.insert("t", payload_of(10), idempotency_key="small-2")
    assert [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX, max_bytes=1500)).events] == [
        "high",
        "low",
    ]
    assert [e.idempotency_key for e in run(h.store.claim(1, max_attempts=MAX, max_bytes=10**6)).events] == ["small"]


def test_renew_restarts_the_lease_of_what_the_claim_still_holds_and_nothing_else(h: Harness) -> None:
    h.insert("t", {}, key="b", idempotency_key="lost")
    h.insert("t", {}, key="a", idempotency_key="mine")
    h.insert("t", {}, key="c", idempotency_key="other")
    claim = run(h.store.claim(2, max_attempts=MAX))
    h.expire_leases(ago=5, idem="lost")  # one event's lease ran out
    taken = run(h.store.claim(1, max_attempts=MAX))  # and another relay took it over
    assert [e.idempotency_key for e in taken.events] == ["lost"]
    before = {idem: h.snapshot(idem) for idem in ("lost", "other")}
    assert run(h.store.renew(claim)) == {h.id_of("mine")}
    state, attempts, token, lease_expires_at, _, _ = h.snapshot("mine")
    assert (state, attempts, token) == ("pending", 1, claim.token)
    assert lease_expires_at > datetime.now(UTC) + timedelta(seconds=20)  # both stores lease for 30 s
    assert {idem: h.snapshot(idem) for idem in ("lost", "other")} == before
    # Renewed, the claim settles as any other; the lost event stays the other relay's.
    settled = run(h.store.settle(claim, sent=[h.id_of("mine"), h.id_of("lost")], retry=[], dead=[]))
    assert (settled.sent, settled.lost) == (1, 1)
    assert h.state_of("lost") == "pending"


@pytest.mark.parametrize(
    "attempts",
    [
        (0, 2, 2, 0),  # the middle of the run dead-lettered (the case)
        (0, 0, 2, 2),  # its end (its first, and all of it: tests/unit/test_renewal_order.py)
        (0, 0, 0, 0),  # none: the lease ended, nobody took the rows
    ],
    ids=["middle", "last", "none"],
)
def test_renew_keeps_nothing_once_the_lease_ended_whatever_a_reaper_did_meanwhile(
    h: Harness, attempts: tuple[int, ...]
) -> None:
    # History (requeue, replay, a late commit) can leave a key's later events with more attempts than
    # its first. The batch's relay stalls past the lease; another relay's reaper dead-letters the events
    # at the limit. Renewing what is still under the batch's token would send the rest of the run past
    # the dead letters: a renewal after the lease ended keeps nothing.
    idems = [f"k:{n}" for n in range(1, len(attempts) + 1)]
    for idem, spent in zip(idems, attempts, strict=True):
        h.insert("t", {}, key="k", idempotency_key=idem)
        h.set_attempts(idem, spent)
    claim = run(h.store.claim(10, max_attempts=MAX))
    assert [e.attempts for e in claim.events] == [spent + 1 for spent in attempts]
    h.expire_leases()
    assert run(h.store.reap(max_attempts=MAX)) == sum(spent + 1 >= MAX for spent in attempts)
    assert run(h.store.renew(claim)) == set()
    # No lease was started again: the key starts again at its first, in the table, up to its first
    # dead letter, each event's expired lease taken over.
    first_dead = next((n for n, spent in enumerate(attempts) if spent + 1 >= MAX), len(attempts))
    again = run(h.store.claim(10, max_attempts=MAX))
    assert [e.idempotency_key for e in again.events] == idems[:first_dead]
    assert again.reaped == first_dead


def test_renew_leaves_an_event_dead_lettered_meanwhile(h: Harness) -> None:
    h.insert("t", {}, key="k", idempotency_key="x")
    claim = run(h.store.claim(10, max_attempts=1))
    h.expire_leases()
    assert run(h.store.reap(max_attempts=1)) == 1
    before = h.snapshot("x")
    assert run(h.store.renew(claim)) == set()
    assert h.snapshot("x") == before and before[0] == "failed"


def test_an_event_with_no_lease_is_never_reaped_whatever_its_attempts(h: Harness) -> None:
    # Its attempts at the limit (max_attempts lowered since, or a retry's): no relay holds it, so the reaper
    # leaves it, and it is claimed (MySQL's "no lease" is a date in the past, not NULL: migration 0007).
    h.insert("t", {}, key="k", idempotency_key="x")
    h.set_attempts("x", MAX)
    assert run(h.store.reap(max_attempts=MAX)) == 0
    assert h.state_of("x") == "pending"
    assert [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX)).events] == ["x"]


def test_the_oldest_pending_age_looks_past_a_hundred_priorities(h: Harness) -> None:
    # One old event below many fresh ones, each of its own priority: the gauge an alert on
    # "events are not moving" reads must still find it (MySQL probed 100 priorities, then stopped).
    h.insert("t", {}, idempotency_key="old", priority=-1)
    h.created("old", 3600)
    for priority in range(105):
        h.insert("t", {}, idempotency_key=f"fresh-{priority}", priority=priority)
    assert 3500 < run(h.store.oldest_pending_age()) < 3700
    assert 3500 < run(h.admin.status()).oldest_pending_age_seconds < 3700


def test_the_oldest_pending_age_is_never_below_0(h: Harness) -> None:
    # created_at is the writer's to set: one ahead of the clock is not an age below 0.
    h.insert("t", {}, idempotency_key="ahead")
    h.created("ahead", -3600)
    assert run(h.store.oldest_pending_age()) == 0
    assert run(h.admin.status()).oldest_pending_age_seconds == 0


def test_a_key_behind_a_dead_letter_is_parked_not_waiting_on_a_schedule(h: Harness) -> None:
    # k: dead letter, then an event not due, then a due one: the dead letter holds the key.
    h.insert("t", {}, key="k", idempotency_key="dead")
    claim = run(h.store.claim(10, max_attempts=MAX))
    run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(claim.events[0].id, "refused")]))
    h.insert("t", {}, key="k", idempotency_key="later", deliver_at=datetime.now(UTC) + timedelta(hours=1))
    h.insert("t", {}, key="k", idempotency_key="due")
    for status in (run(h.store.status()), run(h.store.gauges())):
        assert (status.parked_keys, status.scheduled, status.keys_waiting_on_schedule) == (1, 1, 0)


@pytest.mark.parametrize(
    ("written", "counted"),
    [(2**31 - 1, 2**31 - 1), (2**31 - 2, 2**31 - 1), (-(2**31), 1), (-1, 1), (0, 1), (MAX + 5, MAX + 6)],
)
def test_a_claim_counts_an_attempt_within_the_column_whatever_the_row_holds(
    h: Harness, written: int, counted: int
) -> None:
    # attempts is the relay's column, but plain SQL can write any int there: the claim that
    # added 1 to the largest one failed, and every claim after it (one row stopped the relay).
    h.insert("t", {}, key="k", idempotency_key="odd")
    h.insert("t", {}, idempotency_key="odd-null")
    h.insert("t", {}, key="j", idempotency_key="plain")
    for idem in ("odd", "odd-null"):
        h.set_attempts(idem, written)
    claim = run(h.store.claim(10, max_attempts=MAX))
    assert {e.idempotency_key: e.attempts for e in claim.events} == {"odd": counted, "odd-null": counted, "plain": 1}
    assert h.snapshot("odd")[1] == counted
