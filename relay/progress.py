"""The relay's progress line: at INFO, now and then while it delivers, what it did and what waits.

An operator tailing the log of a busy relay sees it work (events a second,
the backlog, the oldest pending age) without scraping ``/metrics``; an idle
relay says nothing.
"""

from __future__ import annotations

import logging

from relay.store.base import Status

logger = logging.getLogger(__name__)

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
