"""Per-key holds: a later event of a key never reaches the broker after an earlier one failed.

A claim may hand out several events of one key: a run of them in one batch,
and, on sinks that keep a key's order across batches (``Sink.chains_keys``),
the key's next events while the earlier ones are still in flight. Each such
event is ``chained``: it may be published only if every earlier event of its
key handed out so far was acknowledged, or is on its way in an order the
broker keeps. The first event of a key that was not (a failure, a refusal, a
timeout, a batch given back) puts the key on hold; every chained event of a
held key is then given back untried (:data:`relay.events.HELD`). An event that
is not chained starts its key afresh: the claim saw no earlier event of its key
in flight, so whatever went wrong before has been settled in the table. A
batch that renews its lease and loses an event of a key marks its other events
of that key chained (:meth:`KeyHolds.hold_lost`): they are not a fresh start.

Sinks call :meth:`KeyHolds.admit` as they hand each event to the broker, in
order, and :meth:`KeyHolds.hold` for each event they will not report
acknowledged, before a later batch is handed over. The batch room
(:class:`relay.batch.life.Deliveries`, their one owner) holds the keys of a
batch it gives back without publishing. Thread-safe: a sink may call it
from its delivery thread.

A hold stands from the batch it broke in, in claim order: the room numbers
its batches and hands each sink call the holds as that batch sees them
(:meth:`KeyHolds.of`). An event of an earlier batch comes before what broke,
so a later batch's hold neither stops it nor is lifted by it: a sink may
admit an earlier batch's events late (a produce thread behind a backlog) after
a later batch was given back, and an unchained event of the earlier batch
must not then free the key for a batch chained on the given-back one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from relay.events import Event


class KeyHolds:
    """The keys whose chain of in-flight events is broken, each from the batches it broke in; as batch
    ``batch`` sees them (0 for holds used on their own, outside a batch room)."""

    def __init__(self, batch: int = 0) -> None:
        #: Each held key, with the batches (in claim order) whose holds on it stand.
        self._held: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self.batch = batch

    def of(self, batch: int) -> KeyHolds:
        """The same holds, as the events of batch ``batch`` (claim order) see them and hold keys."""
        view = KeyHolds.__new__(KeyHolds)
        view._held, view._lock, view.batch = self._held, self._lock, batch
        return view

    def admit(self, event: Event) -> bool:
        """Whether ``event`` (of this batch) may go to the broker now; False means answer it with ``HELD``.

        A hold from this batch or an earlier one stops a chained event; an unchained one lifts them (the
        claim saw nothing of its key in flight: they were settled). Holds from later batches stand."""
        key = event.key
        if key is None or key not in self._held:
            # A dict's lookup is one step under the interpreter lock: it sees the holds
            # as they stand, as a reader under the lock would. Most keys are not held.
            return True
        with self._lock:
            since = self._held.get(key)
            if since is None:
                return True
            batch = self.batch
            if event.chained:
                return min(since) > batch
            later = {b for b in since if b > batch}
            if later:
                self._held[key] = later
            else:
                del self._held[key]
            return True

    def hold(self, events: Iterable[Event]) -> None:
        """Put the keys of ``events`` (ones of this batch that will not be acknowledged) on hold."""
        keys = {e.key for e in events if e.key is not None}
        if keys:
            batch = self.batch
            with self._lock:
                for key in keys:
                    self._held.setdefault(key, set()).add(batch)

    def hold_lost(self, lost: Iterable[Event], kept: Iterable[Event]) -> list[Event]:
        """Hold the keys of ``lost`` (a batch's events it no longer holds), and mark chained each of ``kept``
        of those keys: none of them may lift the hold. Those events, marked, are returned.

        A batch that loses an event of a key in flight (another relay took it,
        or dead-lettered it after the lease ended) must send no event of that
        key: not a later one, which would overtake it, and not an earlier one
        either, since an unchained event lifts the hold and the later ones, in
        this batch or a batch chained on it, would then go out. They go back
        untried; the key starts afresh from its first, in the table.
        """
        lost = list(lost)
        self.hold(lost)
        broken = {e.key for e in lost if e.key is not None}
        marked = [e for e in kept if e.key in broken]
        for event in marked:
            event.chained = True
        return marked

    def snapshot(self) -> frozenset[str]:
        """The keys on hold now (from any batch)."""
        with self._lock:
            return frozenset(self._held)

    def held(self, key: str) -> bool:
        """Whether ``key`` is on hold from any batch (for tests and logs)."""
        with self._lock:
            return key in self._held


def mark_chained(events: Sequence[Event], in_flight: Iterable[Sequence[Event]]) -> None:
    """Mark ``events`` chained whose key has events ``in_flight`` at this relay, whatever the claim saw.

    Only an event whose key has nothing in flight here may lift a hold on its
    key: the claim may have started a key afresh (a late commit below the
    chain, a batch whose lease ran out) while later events of the key are
    still on their way from this relay.
    """
    flying = {e.key for batch in in_flight for e in batch if e.key is not None}
    if flying:
        for event in events:
            if event.key in flying:
                event.chained = True
