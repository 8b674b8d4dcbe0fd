"""Where a claim starts scanning: a keyset hint, with a full scan as the safety net.

A sent event's row is deleted (or leaves the claim index's predicate), but its
entry stays in the claim index until vacuum removes it, and vacuum cannot
while any transaction older than the delete is open. A claim that scans the
index from the start then visits the heap for every one of those entries:
with a long transaction open beside a steady load, the claim slows down
with every second the transaction stays open (seed 003, Brandur's 15x).

So most claims only look at ids from a *floor* up (``id >= after``), and for
each priority seen so far (up to ``MAX_HINT_PRIORITIES``) they enter the
index at (priority, floor): the entries below the floor are neither visited
nor read. A full scan (the
whole index, every priority) runs at least every
``full_scan_interval`` seconds (further apart when full scans are slow: a
full scan that took d seconds waits 100 d, up to 10 s, so the dead entries
cost about 1% of the claim connection's time while full scans take under
0.1 s). The floor is chosen so that what
a hinted claim skips is rare and waits only for the next full scan:

- it is the lowest id returned by an earlier claim C, once every writer
  that took a lower id before C ran has ended. Ids are taken in order as rows
  are inserted (the column's identity default, which caches one value), so a
  lower id that C could not see belonged to a writer already running; a
  claim after that writer's end, still scanning from the old floor, saw what
  it committed. The relay knows that moment from transaction ids: each claim
  that returns events also returns its own transaction id (assigned while it runs, so above every id
  assigned before it started) and its snapshot's ``xmin`` (every transaction
  below it had ended). C is confirmed once some claim's ``xmin`` reaches the
  transaction id of the first claim that started ``confirm_margin`` after C
  returned: the margin covers a writer between taking its event's id and
  being given its transaction id, which PostgreSQL does a moment later, in
  the same INSERT. A writer open for longer than an interval does not hold
  the floor back further: past an interval C moves the floor anyway, and an
  event that writer commits below it waits for the next full scan;
- it never passes the lowest id of a batch this relay has in flight, nor,
  once that batch is settled, the batch's lowest id: the later events of those
  keys (higher ids) become claimable exactly then, and must not wait;
- retries, releases, requeued dead letters, expired leases, events whose
  ``deliver_at`` comes, events with ids not taken from the column's default
  and lower-priority events a full batch of higher-priority ones passed over,
  below the floor, are found by the next full scan, an interval later (up to
  ``FULL_SCAN_MAX_INTERVAL_SECONDS`` while full scans are slow; a retry waits
  its backoff anyway). So are events of a priority no claim has returned
  yet (the relay starts out knowing only 0, the default), wherever their ids,
  provided the full scan has room for them after the higher priorities.

While writers are short, the floor trails the newest claims by little more
than the margin, so a hinted claim steps over that much of dead entries
rather than an interval's worth. A long reader (S4's REPEATABLE READ
transaction, a report) has no transaction id and does not hold it back; a
long writer anywhere in the cluster does, for at most an interval.

Order and delivery do not depend on the floor: the per-key check still looks
at every earlier event of the key, and every due event is seen by a full scan.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

#: At most this long between two full scans of the claim index, while they are cheap.
FULL_SCAN_INTERVAL_SECONDS = 1.0
#: A full scan that took d seconds is not repeated for ``d * FULL_SCAN_SPACING`` seconds,
#: so full scans take about 1% of the claim connection's time (while a full scan
#: takes under 0.1 s), however many dead entries a long transaction keeps in the index ...
FULL_SCAN_SPACING = 100.0
#: ... but never more than this long apart.
FULL_SCAN_MAX_INTERVAL_SECONDS = 10.0
#: Past this many priorities seen, hinted claims check the floor on every index entry
#: instead (each priority costs them one descent of the index).
MAX_HINT_PRIORITIES = 64
#: A writer is given its transaction id at most this long after taking its event's id
#: (both happen in the same INSERT); see the module docstring.
CONFIRM_MARGIN_SECONDS = 0.05


@dataclass(slots=True)
class _Recent:
    """A claim too recent to move the floor yet."""

    at: float
    lowest: int
    #: The transaction id of the first claim that started a margin after this one
    #: returned: every writer that took a lower id than ``lowest`` before this
    #: claim had its transaction id, below this one, by then.
    guard: int | None = None


class ClaimFloor:
    """The ``after`` id for the next claim, from the claims and settles so far."""

    def __init__(
        self,
        full_scan_interval: float = FULL_SCAN_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        *,
        confirm_margin: float = CONFIRM_MARGIN_SECONDS,
    ) -> None:
        self._interval = full_scan_interval
        self._margin = min(confirm_margin, full_scan_interval)
        self._clock = clock
        self._next_full_scan = 0.0
        self._floor = 0
        self._recent: deque[_Recent] = deque()
        # The highest snapshot xmin of any claim so far: every transaction below it had ended.
        self._max_xmin = 0
        self._in_flight: dict[UUID, int] = {}
        # The priorities of every event claimed so far: hinted claims look at these only.
        self._priorities = {0}

    def priorities(self) -> list[int] | None:
        """The priorities a hinted claim looks at: 0 and every one a claim has returned.

        None past ``MAX_HINT_PRIORITIES``: then it looks at every priority.
        """
        return sorted(self._priorities) if len(self._priorities) <= MAX_HINT_PRIORITIES else None

    def next_after(self) -> int:
        """The lowest id the next claim considers: 0 for a full scan."""
        now = self._clock()
        # A claim's lowest id becomes the floor once the writers it could not see
        # have ended (a later claim, scanning from the old floor, saw what they
        # committed), or once it is an interval old, whichever comes first.
        while self._recent and self._confirmed(self._recent[0], now):
            self._floor = max(self._floor, self._recent.popleft().lowest)
        if now >= self._next_full_scan:
            return 0
        return min(self._floor, *self._in_flight.values()) if self._in_flight else self._floor

    def _confirmed(self, claim: _Recent, now: float) -> bool:
        if now - claim.at >= self._interval:
            return True
        return claim.guard is not None and claim.guard <= self._max_xmin

    def claimed(
        self,
        token: UUID,
        ids: Sequence[int],
        *,
        after: int,
        took: float = 0.0,
        xids: tuple[int, int] | None = None,
        priorities: Iterable[int] = (),
    ) -> None:
        """Note a claim made with ``after`` (from :meth:`next_after`) that returned ``ids`` in ``took`` seconds.

        ``xids`` is the claim's snapshot ``xmin`` and its own transaction id;
        without them, earlier claims move the floor only once an interval old.
        ``priorities`` are those of the events it returned.
        """
        now = self._clock()
        self._priorities.update(priorities)
        if xids is not None:
            xmin, own = xids
            self._max_xmin = max(self._max_xmin, xmin)
            started = now - took
            for claim in self._recent:  # oldest first
                if started - claim.at < self._margin:
                    break
                if claim.guard is None:
                    claim.guard = own
        if ids:
            lowest = min(ids)
            self._in_flight[token] = lowest
            self._recent.append(_Recent(now, lowest))
        if after == 0:
            spacing = min(max(self._interval, took * FULL_SCAN_SPACING), FULL_SCAN_MAX_INTERVAL_SECONDS)
            self._next_full_scan = now + spacing

    def finished(self, token: UUID) -> None:
        """The batch of ``token`` is settled or released: its keys' later events may be due now."""
        lowest = self._in_flight.pop(token, None)
        if lowest is None:
            return
        self._floor = min(self._floor, lowest)
        for claim in self._recent:
            claim.lowest = min(claim.lowest, lowest)
