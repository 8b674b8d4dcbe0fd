"""The per-key piece every sink that chains keys uses (relay.sinks.keyorder): tails, holds, followers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from relay.events import Event
from relay.holds import KeyHolds
from relay.sinks.keyorder import KeyOrder, Turns


def events(keys: list[str | None], *, chained: bool = False, start: int = 0) -> list[Event]:
    made = [
        Event(start + n, "t", key, b"{}", {}, f"id-{start + n}", 0, datetime.now(UTC)) for n, key in enumerate(keys)
    ]
    return [replace(e, chained=chained) for e in made]


def test_a_calls_first_event_of_a_key_follows_the_keys_last_in_the_calls_entered_before() -> None:
    order = KeyOrder()
    first = Turns(events(["a", "b", "a", None]), KeyHolds())
    second = Turns(events(["a", "c", "a", "b"], chained=True, start=4), first.holds)
    order.enter(first)
    first.settle(1, acknowledged=True)  # b's tail is final: b's next need not wait
    order.enter(second)

    assert second.before == {0: (first, 2)}
    assert order.tail("a") == (second, 2) and order.tail("b") == (second, 3) and order.tail("c") == (second, 1)
    order.leave(second)
    assert order.tail("a") is None and order.tail("b") is None
    order.leave(first)  # its tails were taken over: nothing of it is left
    assert order.tail("a") is None


def test_a_key_is_held_before_whatever_follows_its_event_is_woken() -> None:
    holds = KeyHolds()
    turns = Turns(events(["a", "b"]), holds)
    woken: list[tuple[bool, bool]] = []
    turns.follow(0, lambda acknowledged: woken.append((acknowledged, holds.held("a"))))
    turns.follow(1, lambda acknowledged: woken.append((acknowledged, holds.held("b"))))

    turns.settle(0, acknowledged=False)
    turns.settle(1, acknowledged=True)
    turns.follow(0, lambda acknowledged: woken.append((acknowledged, True)))  # final already: told at once

    assert woken == [(False, True), (True, False), (False, True)]


def test_a_call_left_unfinished_holds_its_keys_and_wakes_its_followers_not_acknowledged() -> None:
    holds = KeyHolds()
    order = KeyOrder()
    woken: list[bool] = []
    earlier = Turns(events(["a", "b", None]), holds)

    with pytest.raises(TimeoutError), order.entered(earlier):
        earlier.settle(1, acknowledged=True)
        later = Turns(events(["a", "b"], chained=True, start=3), holds)
        order.enter(later)
        for turns, tail in later.before.values():
            turns.follow(tail, woken.append)
        raise TimeoutError  # the publish call ends without outcomes for "a" and the keyless event

    assert woken == [False]  # "a" only: "b" was acknowledged before the later call was entered
    assert holds.held("a") and not holds.held("b")
    assert not later.admit(0) and later.admit(1)


def test_without_holds_every_event_is_admitted_and_nothing_is_held() -> None:
    turns = Turns(events(["a", "a"], chained=True), None)
    turns.settle(0, acknowledged=False)
    assert turns.admit(1)
