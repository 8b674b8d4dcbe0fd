"""The keyset hint's bookkeeping, on a clock the test moves."""

from __future__ import annotations

from uuid import uuid4

from relay.store.floor import MAX_HINT_PRIORITIES, ClaimFloor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def settled_claim(
    floor: ClaimFloor, ids: list[int], *, after: int = 1, took: float = 0.01, xids: tuple[int, int] | None = None
) -> None:
    """A claim whose batch is settled at once."""
    token = uuid4()
    floor.claimed(token, ids, after=after, took=took, xids=xids)
    floor.finished(token)


def test_a_full_scan_comes_first_and_then_every_interval() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock)
    assert floor.next_after() == 0
    floor.claimed(uuid4(), [50, 51], after=0)
    clock.now += 0.5
    assert floor.next_after() == 0  # a hinted claim, but no claim is an interval old yet
    floor.claimed(uuid4(), [60], after=0)
    clock.now += 1.0
    assert floor.next_after() == 0  # the interval since the last full scan is up


def test_a_claim_moves_the_floor_to_its_lowest_id_once_it_is_an_interval_old() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock)
    settled_claim(floor, [50, 51], after=0, took=0.3)  # slow full scan: the next one 6 s later
    clock.now += 0.5
    settled_claim(floor, [80, 90])  # a hinted claim
    # Not 80: a writer that took id 60 before the second claim and commits after it must not wait.
    clock.now += 0.6
    assert floor.next_after() == 50
    clock.now += 0.5
    assert floor.next_after() == 80


def test_a_batch_in_flight_or_just_settled_keeps_the_floor_at_its_lowest_id() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock)
    early = uuid4()
    floor.claimed(early, [10, 30], after=0, took=0.3)  # id 10 is the head of a key; its next event waits
    clock.now += 0.5
    settled_claim(floor, [40])  # a hinted claim
    clock.now += 1.0
    assert floor.next_after() == 10  # 40 without the batch in flight
    floor.finished(early)
    assert floor.next_after() == 10  # its key's next event is due now, above 10
    floor.claimed(uuid4(), [45], after=10)
    clock.now += 1.1
    assert floor.next_after() == 45  # a claim made after the settle has seen that event


def test_a_settle_also_caps_claims_not_yet_old_enough_to_move_the_floor() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock)
    head, other = uuid4(), uuid4()
    floor.claimed(head, [10], after=0, took=0.3)
    clock.now += 0.2
    floor.claimed(other, [40], after=1)  # a hinted claim
    floor.finished(other)
    floor.finished(head)  # after the claim of 40, before it is old enough
    clock.now += 1.0
    assert floor.next_after() == 10


def test_slow_full_scans_are_spaced_out_but_not_past_the_cap() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock)
    floor.claimed(uuid4(), [5], after=0, took=0.04)  # 40 ms: the next full scan 4 s later
    clock.now += 3.9
    assert floor.next_after() == 5
    clock.now += 0.2
    assert floor.next_after() == 0
    floor.claimed(uuid4(), [7], after=0, took=1.0)  # would be 100 s: capped at 10
    clock.now += 9.9
    assert floor.next_after() == 5
    clock.now += 0.2
    assert floor.next_after() == 0


def test_a_claim_moves_the_floor_once_the_writers_it_could_not_see_have_ended() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock, confirm_margin=0.05)
    settled_claim(floor, [50], after=0, xids=(100, 105))  # a full scan; the next one 1 s later
    clock.now += 0.02
    settled_claim(floor, [80], xids=(103, 110))  # started within the margin of the first: no guard for it
    clock.now += 0.08
    # Started a margin after both returned: a writer that took an id below theirs
    # before they ran had its transaction id by then, so below 112.
    settled_claim(floor, [90], xids=(104, 112))
    assert floor.next_after() == 0  # 104 to 111 may still be running
    clock.now += 0.1
    settled_claim(floor, [95], xids=(112, 115))  # every transaction below 112 has ended
    assert floor.next_after() == 80  # not 90: its guard is 115
    clock.now += 0.1
    settled_claim(floor, [99], xids=(116, 120))
    assert floor.next_after() == 90


def test_a_later_claims_xmin_alone_does_not_confirm_a_claim() -> None:
    # A writer whose transaction id is above every completed one is in no
    # snapshot's xmin yet: only the guard, a transaction id assigned a margin
    # after the claim, bounds the writers that took lower ids.
    clock = Clock()
    floor = ClaimFloor(1.0, clock, confirm_margin=0.05)
    settled_claim(floor, [50], after=0, took=0.3, xids=(100, 101))
    clock.now += 0.01
    settled_claim(floor, [60], took=0.005, xids=(500, 501))  # high xmin, but too soon to guard
    clock.now += 0.5
    assert floor.next_after() == 0


def test_claims_without_transaction_ids_move_the_floor_only_an_interval_later() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock, confirm_margin=0.05)
    settled_claim(floor, [50], after=0, took=0.3)
    clock.now += 0.5
    settled_claim(floor, [80])
    assert floor.next_after() == 0
    clock.now += 0.5
    assert floor.next_after() == 50  # the first is an interval old; the second is not


def test_a_writer_open_longer_than_an_interval_does_not_hold_the_floor_back() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock, confirm_margin=0.05)
    settled_claim(floor, [50], after=0, took=0.3, xids=(100, 105))
    for step in range(9):
        clock.now += 0.1
        settled_claim(floor, [60 + step], xids=(100, 110 + step))  # 100 never ends
    assert floor.next_after() == 0
    clock.now += 0.11
    assert floor.next_after() == 50  # the first claim is an interval old: the old rule takes over


def test_hinted_claims_look_at_priority_0_and_every_priority_claimed_so_far() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock)
    assert floor.priorities() == [0]
    floor.claimed(uuid4(), [5, 6], after=0, priorities={9, -2})
    floor.claimed(uuid4(), [], after=0, priorities=())
    assert floor.priorities() == [-2, 0, 9]


def test_past_too_many_priorities_hinted_claims_keep_the_floor_for_every_priority() -> None:
    clock = Clock()
    floor = ClaimFloor(1.0, clock)
    settled_claim(floor, [5], after=0)
    clock.now += 1.1
    settled_claim(floor, [7], after=0)  # the next full scan an interval from now
    assert floor.next_after() == 5  # the first claim is an interval old: it moved the floor
    floor.claimed(uuid4(), [8], after=5, priorities=range(1, MAX_HINT_PRIORITIES))  # 0 makes 64
    assert floor.priorities() == list(range(MAX_HINT_PRIORITIES))
    floor.claimed(uuid4(), [9], after=5, priorities=[MAX_HINT_PRIORITIES])
    assert floor.priorities() is None  # one too many to enter one by one: all of them, from the start
    assert floor.next_after() == 5  # still a hinted claim, not a full scan
