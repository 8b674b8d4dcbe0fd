"""Where a claim starts scanning: a keyset hint, with a full scan as the safety net.

A sent event's row is deleted (or leaves the claim index's predicate), but its
entry stays in the claim index until vacuum removes it, and vacuum cannot
while any transaction older than the delete is open. A claim that scans the
index from the start then visits the heap for every one of those entries:
with a long transaction open beside a steady load, the claim slows down
with every second the transaction stays open (seed 003, Brandur's 15x).

So most claims only look at ids from a *floor* up (``id >= after``, checked
on the index entry, no heap visit), and a full scan runs at least every
``full_scan_interval`` seconds (further apart when full scans are slow: a
full scan that took d seconds waits 20 d, up to 10 s, so the dead entries
cost at most about 5% of the claim's time). The floor is chosen so that what
a hinted claim skips is rare and waits at most one interval:

- it is the lowest id returned by an earlier claim, once every transaction
  that was running when that claim took its snapshot has ended. An event
  below that id that the claim could not see yet belongs to such a
  transaction (ids are taken in order, when the row is inserted), so a later
  claim, scanning from the old floor, saw it once it committed. Each claim
  returns its snapshot's bounds: a claim is confirmed once a claim's oldest
  running transaction (``xmin``) is at or past its own ``xmax``.
  A transaction that writes for longer than an interval does not hold the
  floor back further: past an interval the claim moves the floor anyway, and
  an event that transaction commits below it waits for the next full scan.
  The claim must also be ``confirm_margin`` old, which covers a writer
  between taking its id and being given a transaction id;
- it never passes the lowest id of a batch this relay has in flight, nor,
  once that batch is settled, the batch's lowest id: the later events of those
  keys (higher ids) become claimable exactly then, and must not wait;
- retries, releases, requeued dead letters, expired leases and lower-priority
  events a full batch of higher-priority ones passed over, below the floor, are
  found by the next full scan, at most an interval later (a retry waits its
  backoff anyway).

With no transaction writing for long, the floor trails the newest claims by
the margin, so a hinted claim steps over a few milliseconds of dead entries
rather than an interval's worth.

Order and delivery do not depend on the floor: the per-key check still looks
at every earlier event of the key, and every due event is seen by a full scan.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

#: At most this long between two full scans of the claim index, while they are cheap.
FULL_SCAN_INTERVAL_SECONDS = 1.0
#: A full scan that took d seconds is not repeated for ``d * FULL_SCAN_SPACING`` seconds,
#: so full scans take at most about 5% of the claim connection's time, however
#: many dead entries a long transaction keeps in the index ...
FULL_SCAN_SPACING = 20.0
#: ... but never more than this long apart.
FULL_SCAN_MAX_INTERVAL_SECONDS = 10.0
#: A claim moves the floor no sooner than this, even once the transactions it
#: could not see have ended (a writer is given its transaction id a moment
#: after its event's id).
CONFIRM_MARGIN_SECONDS = 0.05


@dataclass(slots=True)
class _Recent:
    """A claim too recent to move the floor yet."""

    at: float
    lowest: int
    #: The claim's snapshot xmax: every transaction running at the claim is below it.
    xmax: float


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
        # The highest snapshot xmin of any claim so far: every transaction below it has ended.
        self._ended_below = 0
        self._in_flight: dict[UUID, int] = {}

    def next_after(self) -> int:
        """The lowest id the next claim considers: 0 for a full scan."""
        now = self._clock()
        # A claim's lowest id becomes the floor once the transactions it could not
        # see have ended (a later claim, scanning from the old floor, saw what they
        # committed), or once it is an interval old, whichever comes first.
        while self._recent and self._confirmed(self._recent[0], now):
            self._floor = max(self._floor, self._recent.popleft().lowest)
        if now >= self._next_full_scan:
            return 0
        return min(self._floor, *self._in_flight.values()) if self._in_flight else self._floor

    def _confirmed(self, claim: _Recent, now: float) -> bool:
        age = now - claim.at
        return age >= self._interval or (age >= self._margin and claim.xmax <= self._ended_below)

    def claimed(
        self,
        token: UUID,
        ids: Sequence[int],
        *,
        after: int,
        took: float = 0.0,
        snapshot: tuple[int, int] | None = None,
    ) -> None:
        """Note a claim made with ``after`` (from :meth:`next_after`) that returned ``ids`` in ``took`` seconds.

        ``snapshot`` is the claim's ``(xmin, xmax)``; without it the claim
        moves the floor only once it is an interval old.
        """
        now = self._clock()
        if snapshot is not None:
            self._ended_below = max(self._ended_below, snapshot[0])
        if ids:
            lowest = min(ids)
            self._in_flight[token] = lowest
            self._recent.append(_Recent(now, lowest, math.inf if snapshot is None else snapshot[1]))
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
