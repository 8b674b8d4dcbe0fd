"""The table gauges kept fresh, and the relay's progress line: at INFO, now and then while it delivers,
what it did and what waits.

An operator tailing the log of a busy relay sees it work (events a second,
the backlog, the oldest pending age) without scraping ``/metrics``; an idle
relay says nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from relay.batch.costs import Costs
from relay.errors import StoreUnavailable
from relay.metrics import Metrics
from relay.store.base import Status, Store

logger = logging.getLogger(__name__)

AGE_INTERVAL_SECONDS = 5.0
COUNTS_INTERVAL_SECONDS = 30.0

#: The shortest time between two progress lines.
PROGRESS_INTERVAL_SECONDS = 30.0


class Progress:
    """Logs a progress line at most every ``interval_seconds``, and only when events were delivered since the last.

    ``observe`` takes each gauges reading with the count of events the relay
    has delivered so far and the monotonic time; the rate is over the time
    since the last line (or since the start).
    """

    def __init__(self, sent: int, now: float, *, interval_seconds: float | None = None) -> None:
        self._interval = PROGRESS_INTERVAL_SECONDS if interval_seconds is None else interval_seconds
        self._sent = sent
        self._since = now

    def observe(self, status: Status, *, sent: int, now: float) -> None:
        """Log the line if it is time and events went out since the last one."""
        elapsed = now - self._since
        if elapsed < self._interval:
            return
        delivered = sent - self._sent
        self._sent, self._since = sent, now
        if delivered <= 0:
            return
        rate = delivered / elapsed
        retrying = f", {status.retrying} retrying" if status.retrying else ""
        logger.info(
            "delivered %d events in %.0f s (%.1f/s); backlog %d pending, oldest %.1f s%s",
            delivered,
            elapsed,
            rate,
            status.pending,
            status.oldest_pending_age_seconds,
            retrying,
            extra={
                "action": "progress",
                "delivered": delivered,
                "events_per_second": round(rate, 3),
                "backlog": status.pending,
                "oldest_pending_age_seconds": round(status.oldest_pending_age_seconds, 3),
                "retrying": status.retrying,
            },
        )


async def refresh_gauges(store: Store, metrics: Metrics, costs: Costs, stop: asyncio.Event) -> None:
    """Keep the table gauges fresh until ``stop``: the age often (an index probe), the counts less often
    (bounded reads), and sooner after this relay put an event back to retry (``costs.retried``: a misroute
    shows in seconds); log progress."""
    next_counts = 0.0
    progress = Progress(metrics.sent_events, time.monotonic())
    while not stop.is_set():
        try:
            if time.monotonic() >= next_counts or costs.retried:
                costs.retried = False
                next_counts = max(next_counts, time.monotonic() + COUNTS_INTERVAL_SECONDS)
                status = await store.gauges()
                metrics.observe_status(status)
                progress.observe(status, sent=metrics.sent_events, now=time.monotonic())
            else:
                metrics.oldest_pending_age.set(await store.oldest_pending_age())
        except StoreUnavailable as exc:
            logger.info("gauges not refreshed: %s", exc, extra={"action": "gauges_retry"})
        except Exception as exc:  # noqa: BLE001 - gauges that stop for good would hide every backlog
            # Any other failure (a row no query expected) is said, and the next round tries again:
            # the alerts on these gauges must not go quiet while the relay goes on.
            logger.warning("gauges not refreshed (%s): %s", type(exc).__name__, exc, extra={"action": "gauges_failed"})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), AGE_INTERVAL_SECONDS)
