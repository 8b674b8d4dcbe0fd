"""The backoff formula, by attempt number and as a tenacity wait strategy."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from relay.backoff import Backoff


def bounds(initial: float, cap: float, attempt: int) -> tuple[float, float]:
    exponential = initial * 2.0 ** min(attempt - 1, 1000)
    return min(exponential, cap), min(exponential + initial, cap)


@given(
    initial=st.floats(min_value=0.001, max_value=10),
    factor=st.floats(min_value=1, max_value=1000),
    attempt=st.integers(min_value=1, max_value=5000),
)
def test_a_delay_is_exponential_plus_at_most_one_initial_delay_of_jitter_and_capped(
    initial: float, factor: float, attempt: int
) -> None:
    cap = initial * factor
    low, high = bounds(initial, cap, attempt)
    assert low <= Backoff(initial, cap).delay(attempt) <= high


def test_tenacity_waits_the_same_delays_between_tries() -> None:
    waited: list[float] = []

    async def record(seconds: float) -> None:
        waited.append(seconds)

    async def scenario() -> None:
        retrying = AsyncRetrying(
            wait=Backoff(0.5, 3.0),
            stop=stop_after_attempt(6),
            retry=retry_if_exception_type(OSError),
            sleep=record,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                raise OSError("down")

    with pytest.raises(OSError):
        asyncio.run(scenario())
    assert len(waited) == 5
    for attempt, seconds in enumerate(waited, start=1):
        low, high = bounds(0.5, 3.0, attempt)
        assert low <= seconds <= high, (attempt, seconds)
