"""Backoff delays: exponential with jitter, capped.

One formula serves the retries of an event (across claims, possibly in other
relay processes, so by attempt number) and, as a tenacity wait strategy, the
relay's own retry loops (settles, connects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable

from tenacity import RetryCallState

OUTAGE_BACKOFF_INITIAL_SECONDS = 0.2
OUTAGE_BACKOFF_MAX_SECONDS = 10.0


class Backoff:
    """After failed attempt ``n``: ``initial * 2**(n-1)`` plus up to ``initial`` of jitter, capped at ``max``."""

    def __init__(self, initial_seconds: float, max_seconds: float) -> None:
        self.initial_seconds = initial_seconds
        self.max_seconds = max_seconds

    @classmethod
    def for_outages(cls) -> Backoff:
        """The delays between tries while a server is away."""
        return cls(OUTAGE_BACKOFF_INITIAL_SECONDS, OUTAGE_BACKOFF_MAX_SECONDS)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        # Past 2**1000 the power overflows a float; the cap was reached long before.
        exponent = min(max(1, attempt), 1000) - 1
        exponential = self.initial_seconds * 2.0**exponent
        return min(exponential + random.uniform(0, self.initial_seconds), self.max_seconds)

    def __call__(self, retry_state: RetryCallState) -> float:
        """The delay as a tenacity wait strategy (``wait=``)."""
        return self.delay(retry_state.attempt_number)


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
        await sleep_unless_stopped(stop, self.next_delay())


async def sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def log_before_sleep(logger: logging.Logger, message: str, action: str) -> Callable[[RetryCallState], None]:
    """A tenacity ``before_sleep`` that logs the failure at WARNING with ``message`` (one ``%s``) and ``action``."""

    def log(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        logger.warning(message, error, extra={"action": action})

    return log
