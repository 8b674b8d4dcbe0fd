"""The overlap of the bench's lease-then-delete loops (bench/lease_loop.py), without a database."""

from __future__ import annotations

import threading
import time

import pytest

from bench.lease_loop import _overlapped


def batches(count: int, size: int) -> list[tuple[list[int], str]]:
    return [(list(range(b * size + 1, (b + 1) * size + 1)), f"t{b}") for b in range(count)]


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_every_claimed_batch_is_settled_once_in_order_and_claims_go_on_from_the_last_id(depth: int) -> None:
    planned = batches(6, 4)
    afters: list[int] = []
    settled: list[tuple[list[int], str]] = []

    def claim(after: int) -> tuple[list[int], str] | None:
        afters.append(after)
        return planned[len(afters) - 1] if len(afters) <= len(planned) else None

    result = _overlapped(claim, lambda ids, token: settled.append((ids, token)), depth=depth)
    assert settled == planned
    assert afters == [0, 4, 8, 12, 16, 20, 24]
    assert result["events"] == 24 and result["rate"] > 0


def test_claims_wait_when_depth_batches_are_unsettled() -> None:
    release = threading.Event()
    claimed: list[int] = []
    planned = batches(5, 1)

    def claim(after: int) -> tuple[list[int], str] | None:
        claimed.append(after)
        if len(claimed) == 5:
            # The first batch's settle is blocked: it, 2 queued behind it and a 4th waiting for room are
            # claimed; a 5th claim can only start once that room was made, after the release.
            assert release.is_set()
        return planned[len(claimed) - 1] if len(claimed) <= len(planned) else None

    def settle(ids: list[int], token: str) -> None:
        if token == "t0":
            threading.Timer(0.2, release.set).start()
            release.wait()

    _overlapped(claim, settle, depth=2)
    assert len(claimed) == 6


def test_a_failing_settle_ends_the_loop_with_its_error() -> None:
    claims = [0]

    def claim(after: int) -> tuple[list[int], str] | None:
        claims[0] += 1
        return ([after + 1], "t") if claims[0] < 10_000 else None

    def settle(ids: list[int], token: str) -> None:
        raise PermissionError("no DELETE")

    with pytest.raises(PermissionError, match="no DELETE"):
        _overlapped(claim, settle, depth=1)
    assert claims[0] < 10_000


def test_a_failing_claim_ends_the_settler_too() -> None:
    def claim(after: int) -> tuple[list[int], str] | None:
        if after:
            raise ConnectionError("gone")
        return [1], "t"

    settled: list[list[int]] = []
    with pytest.raises(ConnectionError, match="gone"):
        _overlapped(claim, lambda ids, token: settled.append(ids), depth=2)
    assert settled == [[1]]
    assert not [t for t in threading.enumerate() if t.name == "lease-loop-settle"]


def test_a_time_budget_stops_the_claims_and_counts_what_was_settled_by_then() -> None:
    claims = [0]

    def claim(after: int) -> tuple[list[int], str] | None:
        claims[0] += 1
        time.sleep(0.01)
        return [after + 1, after + 2], "t"  # a backlog that never ends

    settled: list[list[int]] = []
    result = _overlapped(claim, lambda ids, token: settled.append(ids), depth=2, seconds=0.2)
    assert 5 <= claims[0] <= 40
    assert result["events"] == 2 * len(settled) == 2 * claims[0]
    assert result["seconds"] >= 0.2 and result["rate"] == result["events"] / result["seconds"]
