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

- it is the lowest id claimed by a claim made an interval ago or more (any
  claim, not only full scans), so an event whose transaction took its id
  before that claim but committed after it (writers racing) was above the
  floor in force meanwhile; only transactions open for longer than an interval
  can fall below it;
- it never passes the lowest id of a batch this relay has in flight, nor,
  once that batch is settled, the batch's lowest id: the later events of those
  keys (higher ids) become claimable exactly then, and must not wait;
- retries, releases, requeued dead letters, expired leases and lower-priority
  events a full batch of higher-priority ones passed over, below the floor, are
  found by the next full scan, at most an interval later (a retry waits its
  backoff anyway).

Order and delivery do not depend on the floor: the per-key check still looks
at every earlier event of the key, and every due event is seen by a full scan.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from uuid import UUID

#: At most this long between two full scans of the claim index, while they are cheap.
FULL_SCAN_INTERVAL_SECONDS = 1.0
#: A full scan that took d seconds is not repeated for ``d * FULL_SCAN_SPACING`` seconds,
#: so full scans take at most about 5% of the claim connection's time, however
#: many dead entries a long transaction keeps in the index ...
FULL_SCAN_SPACING = 20.0
#: ... but never more than this long apart.
FULL_SCAN_MAX_INTERVAL_SECONDS = 10.0


class ClaimFloor:
    """The ``after`` id for the next claim, from the claims and settles so far."""

    def __init__(
        self, full_scan_interval: float = FULL_SCAN_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = full_scan_interval
        self._clock = clock
        self._next_full_scan = 0.0
        self._floor = 0
        # [claimed at, lowest id] of claims too recent to move the floor yet.
        self._recent: deque[list[float]] = deque()
        self._in_flight: dict[UUID, int] = {}

    def next_after(self) -> int:
        """The lowest id the next claim considers: 0 for a full scan."""
        now = self._clock()
        # A claim's lowest id becomes the floor once the claim is an interval old:
        # a transaction that took a lower id and had not committed at the claim
        # has had that long to commit (and was claimed meanwhile, from the old floor).
        while self._recent and self._recent[0][0] <= now - self._interval:
            self._floor = max(self._floor, int(self._recent.popleft()[1]))
        if now >= self._next_full_scan:
            return 0
        return min(self._floor, *self._in_flight.values()) if self._in_flight else self._floor

    def claimed(self, token: UUID, ids: Sequence[int], *, after: int, took: float = 0.0) -> None:
        """Note a claim made with ``after`` (from :meth:`next_after`) that returned ``ids`` in ``took`` seconds."""
        now = self._clock()
        if ids:
            lowest = min(ids)
            self._in_flight[token] = lowest
            self._recent.append([now, lowest])
        if after == 0:
            spacing = min(max(self._interval, took * FULL_SCAN_SPACING), FULL_SCAN_MAX_INTERVAL_SECONDS)
            self._next_full_scan = now + spacing

    def finished(self, token: UUID) -> None:
        """The batch of ``token`` is settled or released: its keys' later events may be due now."""
        lowest = self._in_flight.pop(token, None)
        if lowest is None:
            return
        self._floor = min(self._floor, lowest)
        for entry in self._recent:
            entry[1] = min(entry[1], lowest)
