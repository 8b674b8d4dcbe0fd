"""Backoff delays, from tenacity's wait strategies."""

from __future__ import annotations

import asyncio
import contextlib

from tenacity import RetryCallState, wait_exponential, wait_random
from tenacity.wait import wait_base

OUTAGE_BACKOFF_INITIAL_SECONDS = 0.2
OUTAGE_BACKOFF_MAX_SECONDS = 10.0


class Backoff:
    """Exponential backoff with jitter: the delay before attempt ``n + 1``.

    A thin adapter so the relay can ask tenacity's strategy for a delay by
    attempt number, outside a tenacity-driven retry loop (the retries of an
    event happen across claims, possibly in different relay processes).
    """

    def __init__(self, initial_seconds: float, max_seconds: float) -> None:
        # initial * 2**(n-1), plus up to one initial delay of jitter, capped.
        self._strategy: wait_base = wait_exponential(multiplier=initial_seconds, max=max_seconds) + wait_random(
            0, initial_seconds
        )
        self._max = max_seconds

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = max(1, attempt)
        return min(float(self._strategy(state)), self._max)


class OutageBackoff:
    """Delays between reconnection tries while a server is away; reset on success."""

    def __init__(
        self,
        initial_seconds: float = OUTAGE_BACKOFF_INITIAL_SECONDS,
        max_seconds: float = OUTAGE_BACKOFF_MAX_SECONDS,
    ) -> None:
        self._backoff = Backoff(initial_seconds, max_seconds)
        self.failures = 0

    def reset(self) -> None:
        """The server answered again."""
        self.failures = 0

    def next_delay(self) -> float:
        """Count a failed try and return the seconds to wait before the next one."""
        self.failures += 1
        return self._backoff.delay(self.failures)

    async def sleep(self, stop: asyncio.Event) -> None:
        """Wait the next delay, or less if ``stop`` is set meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), self.next_delay())
