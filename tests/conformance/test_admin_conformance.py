"""The operator's commands (the ``Admin`` port), the same on every store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from relay.store.base import Dead, ReplayFilter, RequeueFilter, Retry, Skipped
from tests.conformance.harness import GRACE, MAX, Harness, run

INSPECTED_COLUMNS = {
    "id", "topic", "key", "payload", "headers", "idempotency_key", "deliver_at", "priority", "state", "attempts",
    "last_error", "lease_owner", "claim_token", "lease_expires_at", "created_at", "published_at", "failed_at",
    "payload_bytes", "content_type",
}  # fmt: skip


def dead_letter(h: Harness, *idems: str, error: str = "refused") -> None:
    """Claim the events (one per key at a time) and dead-letter them."""
    wanted = set(idems)
    while wanted:
        claim = run(h.store.claim(100, max_attempts=MAX))
        assert claim.events, f"never claimed {wanted}"
        chosen = [e for e in claim.events if e.idempotency_key in wanted]
        run(h.store.settle(claim, sent=[], retry=[], dead=[Dead(e.id, error) for e in chosen]))
        run(h.store.release(claim, [e.id for e in claim.events if e not in chosen]))
        wanted -= {e.idempotency_key for e in chosen}


def test_dead_lists_dead_letters_oldest_first_with_what_they_block(h: Harness) -> None:
    for idem, key in (("d1", "k"), ("d2", None), ("after", "k"), ("alive", None)):
        h.insert("orders", {}, key=key, idempotency_key=idem)
    dead_letter(h, "d1", "d2", error="too large")
    listed = run(h.admin.dead())
    assert [(d.idempotency_key, d.key, d.blocked_events, d.last_error) for d in listed] == [
        ("d1", "k", 1, "too large"),
        ("d2", None, 0, "too large"),
    ]
    assert all(d.topic == "orders" and d.attempts == 1 and d.failed_at is not None for d in listed)
    assert [d.idempotency_key for d in run(h.admin.dead(limit=1))] == ["d1"]
    shown = listed[0].as_dict()
    assert (shown["blocks_key"], shown["blocked_events"]) == ("k", 1)


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (RequeueFilter(key="k1"), {"a"}),
        (RequeueFilter(topic="billing"), {"b", "c"}),
        (RequeueFilter(topic="billing", key="k3"), {"c"}),
        (RequeueFilter(all=True), {"a", "b", "c"}),
    ],
)
def test_requeue_puts_back_exactly_the_selected_dead_letters(
    h: Harness, selection: RequeueFilter, expected: set[str]
) -> None:
    h.insert("orders", {}, key="k1", idempotency_key="a")
    h.insert("billing", {}, key="k2", idempotency_key="b")
    h.insert("billing", {}, key="k3", idempotency_key="c")
    h.insert("billing", {}, key="k4", idempotency_key="alive")
    dead_letter(h, "a", "b", "c")
    requeued = run(h.admin.requeue(selection))
    assert sorted(requeued) == sorted(h.id_of(i) for i in expected)
    assert {i for i in ("a", "b", "c") if h.state_of(i) == "pending"} == expected
    assert h.state_of("alive") == "pending"


def test_requeue_by_id_takes_only_a_dead_letter(h: Harness) -> None:
    h.insert("t", {}, idempotency_key="dead")
    h.insert("t", {}, idempotency_key="waiting")
    dead_letter(h, "dead")
    assert run(h.admin.requeue(RequeueFilter(id=h.id_of("waiting")))) == []
    assert run(h.admin.requeue(RequeueFilter(id=h.id_of("dead")))) == [h.id_of("dead")]
    assert h.snapshot("dead")[:2] == ("pending", 0)


def test_inspect_shows_every_column_by_name(h: Harness) -> None:
    h.insert("t", {"a": [1, "é"]}, key="k", headers={"h": "v"}, idempotency_key="seen", priority=2)
    shown = run(h.admin.inspect(h.id_of("seen")))
    assert shown is not None and set(shown) == INSPECTED_COLUMNS
    assert (shown["topic"], shown["key"], shown["idempotency_key"], shown["priority"]) == ("t", "k", "seen", 2)
    assert (shown["state"], shown["attempts"], shown["headers"]) == ("pending", 0, {"h": "v"})
    assert json.loads(shown["payload"]) == {"a": [1, "é"]}
    assert (shown["payload_bytes"], shown["content_type"]) == (None, None)
    assert isinstance(shown["created_at"], datetime) and shown["lease_expires_at"] is None
    assert run(h.admin.inspect(h.id_of("seen") + 1000)) is None


def test_inspect_shows_a_bytes_payload_as_bytes_with_its_content_type(h: Harness) -> None:
    h.insert("t", b"\x00\xff\xfe", content_type="application/x-protobuf", idempotency_key="raw")
    shown = run(h.admin.inspect(h.id_of("raw")))
    assert shown is not None
    assert (shown["payload"], shown["payload_bytes"], shown["content_type"]) == (
        None,
        b"\x00\xff\xfe",
        "application/x-protobuf",
    )


def test_a_bytes_event_keeps_its_bytes_through_dead_letter_requeue_and_claim(h: Harness) -> None:
    h.insert("t", b"\x00\xff\xc3\x28", key="k", content_type="application/x-avro", idempotency_key="raw")
    h.insert("t", {}, key="k", idempotency_key="behind")
    dead_letter(h, "raw", error="refused")
    [listed] = run(h.admin.dead())
    assert (listed.idempotency_key, listed.key, listed.blocked_events, listed.last_error) == ("raw", "k", 1, "refused")
    assert run(h.admin.requeue(RequeueFilter(key="k"))) == [h.id_of("raw")]
    events = run(h.store.claim(10, max_attempts=MAX)).events
    assert [(e.idempotency_key, e.payload, e.content_type) for e in events] == [
        ("raw", b"\x00\xff\xc3\x28", "application/x-avro"),
        ("behind", b"{}", None),
    ]


def test_purge_deletes_only_kept_events_past_the_cut_off(h: Harness) -> None:
    h.insert_sent("old", sent_ago=7200)
    h.insert_sent("recent", sent_ago=60)
    h.insert("t", {}, key="k", idempotency_key="skipped")
    h.insert("t", {}, idempotency_key="failed")
    h.insert("t", {}, idempotency_key="pending")
    dead_letter(h, "failed")
    assert run(h.admin.skip(h.id_of("skipped"), lease_grace_seconds=GRACE)) is Skipped.SKIPPED
    assert run(h.admin.purge(3600)) == 1
    assert [h.state_of(i) for i in ("old", "recent", "skipped", "failed", "pending")] == [
        None,
        "sent",
        "skipped",
        "failed",
        "pending",
    ]
    assert run(h.admin.purge(0)) == 2  # everything kept, the skipped event included; never the unsent
    assert [h.state_of(i) for i in ("recent", "skipped", "failed", "pending")] == [None, None, "failed", "pending"]


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (ReplayFilter(key="k1"), {"s1", "s2"}),
        (ReplayFilter(topic="billing"), {"s3"}),
        (ReplayFilter(all=True), {"s1", "s2", "s3", "s4"}),
        ("last hour", {"s2", "s3"}),
        ("before the last hour", {"s1", "s4"}),
    ],
)
def test_replay_puts_back_exactly_the_selected_kept_events(
    h: Harness, selection: ReplayFilter | str, expected: set[str]
) -> None:
    h.insert_sent("s1", key="k1", sent_ago=7200)
    h.insert_sent("s2", key="k1", sent_ago=60)
    h.insert_sent("s3", key="k2", topic="billing", sent_ago=60)
    h.insert_sent("s4", sent_ago=7200)
    h.insert("t", {}, idempotency_key="pending")
    if isinstance(selection, str):
        shown = run(h.admin.inspect(h.id_of("s2")))
        assert shown is not None
        hour_ago = shown["published_at"] - timedelta(minutes=59)
        selection = ReplayFilter(since=hour_ago) if selection == "last hour" else ReplayFilter(until=hour_ago)
    replayed = run(h.admin.replay(selection))
    assert sorted(replayed) == sorted(h.id_of(i) for i in expected)
    assert {i for i in ("s1", "s2", "s3", "s4") if h.state_of(i) == "pending"} == expected
    claimed = run(h.store.claim(10, max_attempts=MAX)).events
    assert {e.idempotency_key for e in claimed} >= expected - {"s2"}  # s2 waits behind s1 when both are back


def test_status_through_the_admin_port_counts_like_the_store(h: Harness) -> None:
    for i in range(3):
        h.insert("t", {}, idempotency_key=f"s{i}")
    dead_letter(h, "s0")
    run(h.store.claim(1, max_attempts=MAX))
    by_admin, by_store = run(h.admin.status()), run(h.store.status())
    assert (by_admin.pending, by_admin.in_flight, by_admin.failed) == (1, 1, 1)
    assert (by_admin.pending, by_admin.in_flight, by_admin.failed) == (
        by_store.pending,
        by_store.in_flight,
        by_store.failed,
    )


def test_an_empty_selection_is_refused_and_changes_nothing(h: Harness) -> None:
    h.insert_sent("kept")
    h.insert("t", {}, idempotency_key="dead")
    dead_letter(h, "dead")
    with pytest.raises(ValueError, match="empty selection"):
        run(h.admin.requeue(RequeueFilter()))
    with pytest.raises(ValueError, match="empty selection"):
        run(h.admin.replay(ReplayFilter()))
    assert (h.state_of("kept"), h.state_of("dead")) == ("sent", "failed")
    assert run(h.admin.requeue(RequeueFilter(all=True))) == [h.id_of("dead")]
    assert run(h.admin.replay(ReplayFilter(all=True))) == [h.id_of("kept")]


def test_skip_takes_dead_letters_and_waiting_events_and_releases_their_keys(h: Harness) -> None:
    h.insert("t", {}, key="k1", idempotency_key="dead")
    h.insert("t", {}, key="k1", idempotency_key="behind-dead")
    h.insert("t", {}, key="k2", idempotency_key="waiting", deliver_at=datetime.now(UTC) + timedelta(days=1))
    h.insert("t", {}, key="k2", idempotency_key="behind-waiting")
    dead_letter(h, "dead")
    for idem in ("dead", "waiting"):
        assert run(h.admin.skip(h.id_of(idem), lease_grace_seconds=GRACE)) is Skipped.SKIPPED
        assert h.state_of(idem) == "skipped"
    # The note goes after the last error, or alone for an event that never failed.
    errors = {idem: (run(h.admin.inspect(h.id_of(idem))) or {})["last_error"] for idem in ("dead", "waiting")}
    assert errors["dead"].endswith(" [skipped by operator]") and len(errors["dead"]) > 22
    assert errors["waiting"] == "[skipped by operator]"
    claimed = run(h.store.claim(10, max_attempts=MAX)).events
    assert sorted(e.idempotency_key for e in claimed) == ["behind-dead", "behind-waiting"]


@pytest.mark.parametrize(
    ("lease_ended_ago", "expected"),
    [
        (None, Skipped.IN_FLIGHT),  # the lease is live: a relay is publishing it
        (1, Skipped.IN_FLIGHT),  # just expired: the relay's publish may still be running
        (GRACE - 5, Skipped.IN_FLIGHT),
        (GRACE + 5, Skipped.SKIPPED),  # over long enough: no publish of it can still be running
        (3600, Skipped.SKIPPED),
    ],
)
def test_skip_refuses_an_event_whose_publish_may_still_be_in_flight(
    h: Harness, lease_ended_ago: float | None, expected: Skipped
) -> None:
    h.insert("t", {}, key="k", idempotency_key="leased")
    h.insert("t", {}, key="k", idempotency_key="next")
    run(h.store.claim(10, max_attempts=MAX))
    if lease_ended_ago is not None:
        h.expire_leases(ago=lease_ended_ago)
    before = h.snapshot("leased")
    assert run(h.admin.skip(h.id_of("leased"), lease_grace_seconds=GRACE)) is expected
    if expected is Skipped.IN_FLIGHT:
        assert h.snapshot("leased") == before  # untouched: still leased, still heading its key
    else:
        assert h.state_of("leased") == "skipped"


@pytest.mark.parametrize(
    ("lease_ended_ago", "expected"),
    [(0.5, Skipped.IN_FLIGHT), (GRACE - 5, Skipped.IN_FLIGHT), (GRACE + 5, Skipped.SKIPPED), (3600, Skipped.SKIPPED)],
)
def test_skip_refuses_a_dead_letter_whose_expired_lease_may_still_be_publishing_it(
    h: Harness, lease_ended_ago: float, expected: Skipped
) -> None:
    # Dead-lettered because its lease expired on its last attempt: the relay that held it may
    # have stalled, not died, and still be publishing it, as with a lease that just ended.
    h.insert("t", {}, key="k", idempotency_key="reaped")
    run(h.store.claim(10, max_attempts=1))
    h.insert("t", {}, key="k", idempotency_key="next")
    h.expire_leases(ago=lease_ended_ago)
    assert run(h.store.reap(max_attempts=1)) == 1
    assert h.state_of("reaped") == "failed"
    assert run(h.admin.skip(h.id_of("reaped"), lease_grace_seconds=GRACE)) is expected
    assert h.state_of("reaped") == ("failed" if expected is Skipped.IN_FLIGHT else "skipped")
    # Refused, its key stays parked behind it; requeued, it goes first, whenever that is.
    claimed = [e.idempotency_key for e in run(h.store.claim(10, max_attempts=MAX)).events]
    assert claimed == ([] if expected is Skipped.IN_FLIGHT else ["next"])


@pytest.mark.parametrize("fate", ["dead", "retry", "released"])
def test_skip_refuses_an_event_taken_over_from_a_lease_that_just_ended_whatever_the_new_owner_did(
    h: Harness, fate: str
) -> None:
    # Relay A's lease ended half a second ago: its publish may still be running (the test above
    # refuses the skip then). Relay B took the event over at once, and its own try ended: refused
    # (dead-lettered), failed (a retry due later) or handed back untried. B's try says nothing of A's
    # publish: a skip now would let "next" reach the broker before A's copy of "taken" (reviewed on
    # MariaDB; found by h-revmy).
    h.insert("t", {}, key="k", idempotency_key="taken")
    h.insert("t", {}, key="k", idempotency_key="next")
    run(h.store.claim(10, max_attempts=MAX))  # relay A, which stalls
    h.expire_leases(ago=0.5)
    b = run(h.store.claim(10, max_attempts=MAX))  # relay B
    assert b.reaped == 2
    taken, following = b.events
    if fate == "dead":
        run(h.store.settle(b, sent=[], retry=[], dead=[Dead(taken.id, "refused")]))
    elif fate == "retry":
        run(h.store.settle(b, sent=[], retry=[Retry(taken.id, 3600, "failed")], dead=[]))
    run(h.store.release(b, [following.id] if fate != "released" else [taken.id, following.id]))
    assert run(h.admin.skip(taken.id, lease_grace_seconds=GRACE)) is Skipped.IN_FLIGHT
    if fate != "dead":
        # The lease's end it keeps is no lease of anyone's: the event is claimed again when due, first of its key.
        h.make_due()
        again = run(h.store.claim(10, max_attempts=MAX))
        assert [e.idempotency_key for e in again.events] == ["taken", "next"]
        run(h.store.release(again, [e.id for e in again.events]))
    # Once the grace has passed since the new owner's settle, the skip goes through.
    h.expire_leases(ago=GRACE + 1, idem="taken")
    assert run(h.admin.skip(taken.id, lease_grace_seconds=GRACE)) is Skipped.SKIPPED
    claimed = run(h.store.claim(10, max_attempts=MAX))
    assert [e.idempotency_key for e in claimed.events] == ["next"]


def test_skip_finds_nothing_to_skip_in_sent_skipped_or_missing_events(h: Harness) -> None:
    h.insert_sent("sent")
    h.insert("t", {}, idempotency_key="twice")
    assert run(h.admin.skip(h.id_of("twice"), lease_grace_seconds=GRACE)) is Skipped.SKIPPED
    for event_id in (h.id_of("sent"), h.id_of("twice"), h.id_of("twice") + 1000):
        assert run(h.admin.skip(event_id, lease_grace_seconds=GRACE)) is Skipped.NOT_FOUND
    assert (h.state_of("sent"), h.state_of("twice")) == ("sent", "skipped")


def test_requeue_and_replay_match_a_topic_byte_for_byte(h: Harness) -> None:
    # 'orders ' is another topic (another routing key) than 'orders': MariaDB's padding collation
    # must not make them one.
    for topic in ("orders", "orders ", "orders  "):
        h.insert(topic, {}, idempotency_key=f"dead[{topic}]")
        h.insert_sent(f"sent[{topic}]", topic=topic)
    dead_letter(h, "dead[orders]", "dead[orders ]", "dead[orders  ]")
    assert run(h.admin.requeue(RequeueFilter(topic="orders "))) == [h.id_of("dead[orders ]")]
    assert run(h.admin.replay(ReplayFilter(topic="orders"))) == [h.id_of("sent[orders]")]
    assert run(h.admin.requeue(RequeueFilter(topic="orders   "))) == []


def test_requeue_and_replay_give_their_ids_in_order(h: Harness) -> None:
    idems = [f"e{i}" for i in range(8)]
    for idem in idems:
        h.insert("t", {}, key="k" if idem < "e4" else None, idempotency_key=f"dead-{idem}")
        h.insert_sent(f"sent-{idem}", key="k")
    dead_letter(h, *(f"dead-{idem}" for idem in idems))
    requeued = run(h.admin.requeue(RequeueFilter(all=True)))
    replayed = run(h.admin.replay(ReplayFilter(all=True)))
    assert requeued == sorted(h.id_of(f"dead-{idem}") for idem in idems)
    assert replayed == sorted(h.id_of(f"sent-{idem}") for idem in idems)


def drain_in_order(h: Harness) -> list[str]:
    """Claim and send everything due, one claim at a time: the idempotency keys in the order they went out."""
    sent: list[str] = []
    while claim := run(h.store.claim(100, max_attempts=MAX)):
        if not claim.events:
            break
        sent += [e.idempotency_key for e in claim.events]
        run(h.store.settle(claim, sent=[e.id for e in claim.events], retry=[], dead=[]))
    return sent


def test_requeue_goes_in_batches_by_every_selector_and_a_dry_run_changes_nothing(h: Harness) -> None:
    """Two million dead letters in one statement outlasted the statement timeout and requeued none: a
    selection goes in batches in id order, each its own transaction, each told to ``progress``."""
    events = [
        ("k1-a", "orders", "k1"), ("k1-b", "orders", "k1"), ("k2-a", "orders", "k2"), ("k1-c", "orders", "k1"),
        ("billing-a", "billing", "k3"), ("k2-b", "orders", "k2"), ("nokey-a", "orders", None),
        ("billing-b", "billing", None), ("alive", "orders", "k4"),
    ]  # fmt: skip
    for idem, topic, key in events:
        h.insert(topic, {}, key=key, idempotency_key=idem)
        if idem not in ("k1-b", "alive"):  # k1-b waits behind k1-a, parked, and k1-c is dead behind it
            h.fail(idem)
    pending = {"k1-b", "alive"}
    for selection, expected in [
        (RequeueFilter(id=h.id_of("k2-b")), {"k2-b"}),
        (RequeueFilter(topic="orders", key="k2"), {"k2-a"}),
        (RequeueFilter(key="k1"), {"k1-a", "k1-c"}),
        (RequeueFilter(topic="billing"), {"billing-a", "billing-b"}),
        (RequeueFilter(all=True), {"nokey-a"}),
    ]:
        before = h.states()
        would = run(h.admin.requeue(selection, dry_run=True, batch_size=1))
        assert would == sorted(h.id_of(i) for i in expected), selection
        assert h.states() == before  # the dry run changed nothing
        told: list[int] = []
        assert run(h.admin.requeue(selection, batch_size=1, progress=told.append)) == would
        assert told == [1] * len(expected), selection  # one batch each, each committed
        pending |= expected
        assert {i for i, state in h.states().items() if state == "pending"} == pending, selection
        assert run(h.admin.requeue(selection, batch_size=1)) == []  # run again: nothing left to do
    # A key's dead letters came back each in its place: k1-a, then k1-b that waited behind it, then k1-c.
    assert [i for i in drain_in_order(h) if i.startswith("k1")] == ["k1-a", "k1-b", "k1-c"]


def test_replay_goes_in_batches_by_every_selector_and_a_dry_run_changes_nothing(h: Harness) -> None:
    h.insert_sent("s1", key="k1", sent_ago=7200)
    h.insert_sent("s2", key="k1", sent_ago=60)
    h.insert_sent("s3", key="k2", topic="billing", sent_ago=60)
    h.insert_sent("s4", sent_ago=7200)
    h.insert_sent("s5", key="k1", sent_ago=30)
    h.insert_sent("s6", sent_ago=30)
    shown = run(h.admin.inspect(h.id_of("s2")))
    assert shown is not None
    hour_ago = shown["published_at"] - timedelta(minutes=59)
    replayed: set[str] = set()
    for selection, expected in [
        (ReplayFilter(until=hour_ago), {"s1", "s4"}),
        (ReplayFilter(since=hour_ago, key="k1"), {"s2", "s5"}),
        (ReplayFilter(topic="billing"), {"s3"}),
        (ReplayFilter(all=True), {"s6"}),
    ]:
        before = h.states()
        would = run(h.admin.replay(selection, dry_run=True, batch_size=1))
        assert would == sorted(h.id_of(i) for i in expected), selection
        assert h.states() == before
        told: list[int] = []
        assert run(h.admin.replay(selection, batch_size=1, progress=told.append)) == would
        assert told == [1] * len(expected), selection
        replayed |= expected
        assert {i for i, state in h.states().items() if state == "pending"} == replayed, selection
    assert [i for i in drain_in_order(h) if i in ("s1", "s2", "s5")] == ["s1", "s2", "s5"]


def test_purge_and_skip_dry_runs_change_nothing(h: Harness) -> None:
    h.insert_sent("old", sent_ago=7200)
    h.insert_sent("older", sent_ago=9000)
    h.insert_sent("recent", sent_ago=60)
    h.insert("t", {}, key="k", idempotency_key="dead")
    h.fail("dead")
    told: list[int] = []
    assert run(h.admin.purge(3600, dry_run=True, batch_size=1, progress=told.append)) == 2
    assert told == [1, 1] and [h.state_of(i) for i in ("old", "older", "recent")] == ["sent"] * 3
    before = h.snapshot("dead")
    assert run(h.admin.skip(h.id_of("dead"), lease_grace_seconds=GRACE, dry_run=True)) is Skipped.SKIPPED
    assert h.snapshot("dead") == before
    assert run(h.admin.skip(h.id_of("old"), lease_grace_seconds=GRACE, dry_run=True)) is Skipped.NOT_FOUND
    assert run(h.admin.skip(-1, lease_grace_seconds=GRACE, dry_run=True)) is Skipped.NOT_FOUND
    assert run(h.admin.purge(3600, batch_size=1)) == 2


@pytest.mark.parametrize("how", ["dead letter of long ago", "waiting event written long ago"])
def test_a_skipped_event_is_aged_from_its_skip(h: Harness, how: str) -> None:
    """purge and run --retention aged a skipped event from its dead letter or its write: one skipped a
    moment ago was purged at once."""
    h.insert("t", {}, key="k", idempotency_key="skipped")
    h.created("skipped", 3 * 86400)
    if how.startswith("dead"):
        h.fail("skipped", ago=2 * 86400)
    assert run(h.admin.skip(h.id_of("skipped"), lease_grace_seconds=GRACE)) is Skipped.SKIPPED
    for older_than in (3600, 86400, 1.5 * 86400):
        assert run(h.admin.purge(older_than)) == 0
        assert h.state_of("skipped") == "skipped"
    shown = run(h.admin.inspect(h.id_of("skipped")))
    assert shown is not None and shown["failed_at"] is not None  # the skip's time, what purge reads
    assert run(h.admin.purge(0)) == 1
