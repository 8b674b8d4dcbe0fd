"""A key's hold stands from the batch it broke in (claim order): what earlier and later batches' events do."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from relay.events import Event
from relay.holds import KeyHolds


def _event(event_id: int, *, chained: bool, key: str = "k") -> Event:
    return Event(event_id, "t", key, b"{}", {}, f"id-{event_id}", 0, datetime.now(UTC), chained)


@pytest.mark.parametrize("chained", [False, True])
def test_an_earlier_batchs_event_goes_and_leaves_a_later_batchs_hold_standing(chained: bool) -> None:
    holds = KeyHolds()
    holds.of(5).hold([_event(9, chained=True)])
    assert holds.of(3).admit(_event(4, chained=chained)), "it comes before what broke"
    assert holds.held("k")
    assert not holds.of(6).admit(_event(10, chained=True)), "a batch chained on the broken one stays held"


@pytest.mark.parametrize("hold_in", [2, 3])
def test_a_chained_event_is_held_by_a_hold_of_its_batch_or_an_earlier_one(hold_in: int) -> None:
    holds = KeyHolds()
    holds.of(hold_in).hold([_event(1, chained=False)])
    assert not holds.of(3).admit(_event(2, chained=True))
    assert holds.of(3).admit(_event(3, chained=True, key="other")), "other keys go on"


def test_an_unchained_event_lifts_the_holds_up_to_its_batch_and_not_those_of_later_ones() -> None:
    holds = KeyHolds()
    holds.of(2).hold([_event(1, chained=False)])
    holds.of(7).hold([_event(8, chained=True)])
    assert holds.of(4).admit(_event(3, chained=False)), "a fresh start: what broke in batch 2 is settled"
    assert holds.of(5).admit(_event(4, chained=True)), "batch 2's hold is lifted"
    assert not holds.of(8).admit(_event(9, chained=True)), "batch 7's hold stands"
    assert holds.of(9).admit(_event(8, chained=False))
    assert not holds.held("k")


def test_holds_on_their_own_behave_as_one_batch() -> None:
    holds = KeyHolds()
    holds.hold([_event(1, chained=False)])
    assert not holds.admit(_event(2, chained=True))
    assert holds.admit(_event(3, chained=False)) and not holds.held("k")
