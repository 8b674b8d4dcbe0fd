"""How big the next claim is: halved while claims or publishes time out, grown back as they recover.

A claim that hits the statement timeout tried to read more than it could in
time; a publish that times out may have been stored without an
acknowledgement, so every repeat is a copy. Either way a smaller batch is the
cure: each timeout halves the count and the byte cap, down to one event, and
each claim that comes back fast, or publish acknowledged in full, doubles them
back. Doubling rather than a jump back to full: a broker that times out only
some events (one stalled partition) would otherwise get a full batch, and its
copies, after every small batch that happened to go through.

Large payloads stop a claim at the byte cap long before the count: 16 KB
events fill 16 MB with about 1,000 of 4,000. A claim locks and weighs every
candidate up to its count first, so the count follows the payloads: about what
the cap lets in, going by the last claim's events, plus a margin.
"""

from __future__ import annotations

import math

#: A batch shrunk by claim timeouts doubles again after a claim that took less
#: than this share of the time a claim ran before it timed out (the doubled
#: claim then takes about half of it).
GROW_BELOW_SHARE = 0.25
#: A claim asks for this many times the events the byte cap lets in at the last claim's average size.
BYTES_FIT_MARGIN = 1.25


class BatchLimits:
    """The count and byte cap for the next claim, from the configured ones."""

    def __init__(self, batch_size: int, batch_bytes: int) -> None:
        self._size = batch_size
        self._bytes = batch_bytes
        # Halving past these makes no difference: one event, one byte (a claim takes at least one event).
        self._most_halvings = max(batch_size.bit_length(), batch_bytes.bit_length()) - 1
        self._claim_halvings = 0
        self._publish_halvings = 0
        self._claim_timed_out_after = 0.0
        # Payload bytes per event of the last claim; None before any.
        self._event_bytes: float | None = None

    @property
    def _halvings(self) -> int:
        return max(self._claim_halvings, self._publish_halvings)

    @property
    def count(self) -> int:
        """The most events the next claim may take: fewer when the last claim's payloads say that
        the byte cap will stop it sooner."""
        count = max(1, self._size >> self._halvings)
        if self._event_bytes:
            count = min(count, max(1, math.ceil(self.max_bytes * BYTES_FIT_MARGIN / self._event_bytes)))
        return count

    @property
    def max_bytes(self) -> int:
        """The next claim stops adding events once their payloads reach this many bytes."""
        return max(1, self._bytes >> self._halvings)

    @property
    def smallest(self) -> bool:
        """True when the next claim takes a single event."""
        return self.count == 1

    def took(self, events: int, payload_bytes: int) -> None:
        """A claim took ``events`` events whose payloads hold ``payload_bytes`` bytes: the next count follows them."""
        if events:
            self._event_bytes = payload_bytes / events

    def claim_timed_out(self, seconds: float) -> None:
        """A claim ran ``seconds`` and hit the statement timeout: halve."""
        self._claim_halvings = min(self._halvings + 1, self._most_halvings)
        self._claim_timed_out_after = max(self._claim_timed_out_after, seconds)

    def claimed(self, seconds: float) -> None:
        """A claim came back in ``seconds``: double again if that was well inside the time a claim can take."""
        if self._claim_halvings and seconds < GROW_BELOW_SHARE * self._claim_timed_out_after:
            self._claim_halvings -= 1
            if not self._claim_halvings:
                self._claim_timed_out_after = 0.0

    def publish_timed_out(self) -> None:
        """A publish ended without (some of) its acknowledgements: halve."""
        self._publish_halvings = min(self._halvings + 1, self._most_halvings)

    def published(self) -> None:
        """A publish was acknowledged in full: double back towards the size claims allow."""
        self._publish_halvings = max(0, self._publish_halvings - 1)

    @property
    def shrunk_by_timeouts(self) -> bool:
        """True until publishes have been acknowledged back to the configured size."""
        return self._publish_halvings > 0
