"""What the ``Store`` port claims and settles: a leased batch (:class:`Claim`), a claim answered before its
events are built (:class:`Started`), the outcomes a settle records (:class:`Retry`, :class:`Dead`,
:class:`Settlement`), and the rules every store shares about keys in a claim (:func:`in_key_order`,
:func:`chained_keys`, :func:`within_bytes`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar
from uuid import UUID

from relay.events import Event

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Claim:
    """A leased batch. Settling it needs ``token``; a relay whose lease was
    taken over holds a token that no longer matches, so its settle does nothing."""

    token: UUID
    events: list[Event]
    #: Events whose lease this claim took over once it had ended: the relay that held it may still be
    #: publishing them (a stalled process), so a settle of one records that its lease ended now, not that it
    #: had none, and ``skip`` waits out its grace for it (docs/operations.md).
    taken_over: frozenset[int] = frozenset()
    #: Rows the claim dead-lettered instead of leasing: no event could be made of them (MySQL only).
    buried: int = 0
    #: Keys of this batch that the relay also had in a batch before it: a claim going on from this one
    #: goes on with them even when they have one event here (see :func:`chained_keys`).
    recurring: frozenset[str] = frozenset()

    @property
    def reaped(self) -> int:
        """How many expired leases the claim took over."""
        return len(self.taken_over)


@dataclass(frozen=True, slots=True)
class Retry:
    """An event to try again after ``delay_seconds``."""

    id: int
    delay_seconds: float
    error: str


@dataclass(frozen=True, slots=True)
class Dead:
    """An event to dead-letter with ``error``."""

    id: int
    error: str


@dataclass(frozen=True, slots=True)
class Settlement:
    """What one settle did; ``lost`` counts events whose lease was no longer ours."""

    sent: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0


#: The most attempts the int column holds: a claim counts on from the row's attempts, taken as at
#: least 0 and at most one below this (plain SQL may write any int there), so it never overflows.
MAX_ATTEMPTS_COUNT = 2**31 - 1


def next_attempt(attempts: int) -> int:
    """The attempts a claim gives a row that had ``attempts``: one more, within 1 and the column's range."""
    return min(max(attempts, 0), MAX_ATTEMPTS_COUNT - 1) + 1


class Started(Protocol):
    """A claim the database has answered, whose events may not be built yet (see :meth:`Store.start_claim`)."""

    @property
    def token(self) -> UUID:
        """The claim's token."""

    @property
    def rows(self) -> int:
        """How many events it leased."""

    def tails(self) -> Claim:
        """What a next claim may go on from, as a ``chain`` entry: for each key, its last event here and,
        if it has more, one other (:func:`chained_keys` counts them). Only ``id``, ``topic`` and ``key``
        of these events are real."""

    async def events(self) -> Claim:
        """The claim, its events built."""


@dataclass(frozen=True, slots=True)
class Built:
    """A claim whose events were built with it: :meth:`Store.start_claim` of a store with nothing to gain."""

    claim: Claim

    @property
    def token(self) -> UUID:
        return self.claim.token

    @property
    def rows(self) -> int:
        return len(self.claim.events)

    def tails(self) -> Claim:
        return self.claim

    async def events(self) -> Claim:
        return self.claim


def tails_of(token: UUID, rows: Iterable[tuple[int, Any, Any]], *, decode: bool = False) -> Claim:
    """:meth:`Started.tails` from a claim's ``(id, topic, key)`` rows, in any order (with ``decode``,
    topics and keys as UTF-8 bytes, decoded only for the events kept)."""
    last: dict[str, tuple[int, str]] = {}
    other: dict[str, tuple[int, str]] = {}
    for event_id, topic, key in rows:
        if key is None:
            continue
        held = last.get(key)
        if held is None or event_id > held[0]:
            if held is not None:
                other[key] = held
            last[key] = (event_id, topic)
        else:
            other[key] = (event_id, topic)
    text = (lambda value: bytes(value).decode()) if decode else (lambda value: value)
    events = [
        Event(id=event_id, topic=text(topic), key=text(key), payload=b"", headers={}, idempotency_key="",
              attempts=0, created_at=_NO_TIME)
        for found in (other, last)
        for key, (event_id, topic) in found.items()
    ]  # fmt: skip
    return Claim(token=token, events=events)


_NO_TIME = datetime(1970, 1, 1, tzinfo=UTC)


class _Keyed(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def key(self) -> str | None: ...


def in_key_order(items: Iterable[T], rank: Callable[[T], Any], *, event: Callable[[T], _Keyed]) -> list[T]:
    """``items`` sorted by ``rank``, then each key's put back in id order in its key's places.

    A run may hold a key's later events at a higher priority than its earlier
    ones: they keep their key's order, and the batch otherwise its priorities.
    """
    ordered = sorted(items, key=rank)
    places: dict[str, list[int]] = {}
    for place, item in enumerate(ordered):
        key = event(item).key
        if key is not None:
            places.setdefault(key, []).append(place)
    for spots in places.values():
        if len(spots) > 1:
            ours = sorted((ordered[i] for i in spots), key=lambda item: event(item).id)
            for spot, item in zip(spots, ours, strict=True):
                ordered[spot] = item
    return ordered


K = TypeVar("K", bound=_Keyed)


def within_bytes(placed: Sequence[K], max_bytes: int | None, *, size: Callable[[K], int]) -> list[K]:
    """The items of ``placed`` (in claim order) that came while their ``size`` summed under ``max_bytes``.

    The first always goes in. A key's run is cut, never holed: an item counts
    from the place of the latest of its run's earlier items.
    """
    if max_bytes is None or sum(map(size, placed)) < max_bytes:
        return list(placed)
    place = {item.id: i for i, item in enumerate(placed)}
    at: dict[int, int] = {}
    latest: dict[str, int] = {}
    for item in sorted(placed, key=lambda item: item.id):
        if item.key is None:
            at[item.id] = place[item.id]
        else:
            at[item.id] = latest[item.key] = max(latest.get(item.key, -1), place[item.id])
    chosen, total = [], 0
    for item in sorted(placed, key=lambda item: (at[item.id], item.id)):
        if total >= max_bytes:
            break
        chosen.append(item)
        total += size(item)
    return chosen


def chained_keys(chain: Sequence[Claim]) -> dict[str, Event]:
    """The keys a claim may go on with from the batches ``chain``, each with its last event in them.

    Keys with two events or more in flight, and keys a batch marks ``recurring``
    (the relay had them in an earlier batch too). Any other key with one event in
    flight is most likely not a busy one, and waits for it to settle as on a sink
    that does not chain: that keeps the claim's map of keys small when every
    event has a key of its own. A busy key with one event in each batch (about
    as many keys as a batch holds events) recurs from batch to batch, and goes on.
    """
    last: dict[str, Event] = {}
    count: dict[str, int] = {}
    recurring: set[str] = set()
    for claim in chain:
        recurring.update(claim.recurring)
        for event in claim.events:
            if event.key is not None:
                count[event.key] = count.get(event.key, 0) + 1
                if event.key not in last or event.id > last[event.key].id:
                    last[event.key] = event
    return {key: event for key, event in last.items() if count[key] > 1 or key in recurring}
