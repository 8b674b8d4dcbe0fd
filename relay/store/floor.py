"""Where a claim starts scanning: a keyset hint, with a full scan as the safety net.

Sent rows leave dead entries in the claim index until vacuum can remove them. Most
claims step over them by entering the index at a *floor* id for each priority seen.
The floor trails the claims until no writer that took a lower id can still commit
below it, and never passes a batch in flight; a full scan at least every interval
finds whatever a hinted claim skipped. The argument: docs/how-it-works.md, "Claim floor".
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

#: At most this long between two full scans of the claim index, while they are cheap.
FULL_SCAN_INTERVAL_SECONDS = 1.0
#: The ``after`` a full scan sends to the claim (:meth:`ClaimFloor.next_after` says 0): the least
#: bigint, since plain SQL may write ids below 0 and a scan from 0 would never see them.
FULL_SCAN_AFTER = -(2**63)
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
#: (both happen in the same INSERT); see "Claim floor" in docs/how-it-works.md.
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
