"""The store ports: the database side of the relay (``Store``) and of its operators (``Admin``)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar
from uuid import UUID

from relay.events import Event
from relay.store.batches import ADMIN_BATCH_SIZE, Progress

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Claim:
    """A leased batch. Settling it needs ``token``; a relay whose lease was
    taken over holds a token that no longer matches, so its settle does nothing."""

    token: UUID
    events: list[Event]
    reaped: int = 0
    #: Rows the claim dead-lettered instead of leasing: no event could be made of them (MySQL only).
    buried: int = 0
    #: Keys of this batch that the relay also had in a batch before it: a claim going on from this one
    #: goes on with them even when they have one event here (see :func:`chained_keys`).
    recurring: frozenset[str] = frozenset()


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


@dataclass(frozen=True, slots=True)
class Status:
    """Counts an operator looks at first.

    ``scheduled`` counts the pending events that are not due yet (``deliver_at``
    ahead, or a retry's backoff); ``keys_waiting_on_schedule`` the keys whose due
    events wait behind such an event of their own key.
    """

    pending: int
    in_flight: int
    failed: int
    oldest_pending_age_seconds: float
    parked_keys: int = 0
    scheduled: int = 0
    keys_waiting_on_schedule: int = 0
    #: Events failing and retrying (see :func:`is_retrying`), in all topics, and the age of the oldest.
    retrying: int = 0
    oldest_retrying_age_seconds: float = 0.0
    #: The topics with retrying events, oldest first; the gauges read every topic, ``status`` at most its ``topics``.
    retrying_topics: tuple[RetryingTopic, ...] = ()
    #: Per-topic lag, oldest first (``status`` only; at most its ``topics``).
    topics: tuple[TopicLag, ...] = ()
    #: How many topics have pending events: ``topics`` may show fewer.
    topic_count: int = 0

    def as_dict(self) -> dict[str, object]:
        """The ``status --json`` object."""
        return {
            "pending": self.pending,
            "in_flight": self.in_flight,
            "failed": self.failed,
            "oldest_pending_age_seconds": round(self.oldest_pending_age_seconds, 3),
            "parked_keys": self.parked_keys,
            "scheduled": self.scheduled,
            "keys_waiting_on_schedule": self.keys_waiting_on_schedule,
            "retrying": self.retrying,
            "oldest_retrying_age_seconds": round(self.oldest_retrying_age_seconds, 3),
            "retrying_topics": [t.as_dict() for t in self.retrying_topics],
            "topics": [t.as_dict() for t in self.topics],
            "topic_count": self.topic_count,
        }


def is_retrying(row: Mapping[str, Any], now: datetime) -> bool:
    """Whether an event, as ``inspect`` gives its columns, is retrying at ``now``.

    Retrying is failing, not dead-lettered yet: pending, with an attempt
    behind it that did not deliver it. That is attempts > 0 and no live lease,
    or attempts > 1 in flight again (a claim counts the attempt it starts). A
    dead letter is not retrying: it waits for an operator. The status queries
    of every store say the same in SQL.
    """
    lease = row.get("lease_expires_at")
    # A lease end no datetime holds (plain SQL's 'infinity', as text) is live if it is not '-infinity'.
    leased = lease >= now if isinstance(lease, datetime) else lease is not None and not str(lease).startswith("-")
    attempts = row.get("attempts")
    return row.get("state") == "pending" and isinstance(attempts, int) and attempts > (1 if leased else 0)


@dataclass(frozen=True, slots=True)
class RetryingTopic:
    """The retrying events of one topic: how many, the age of the oldest, and its first one's last error.

    ``event_id`` is that first (lowest id) retrying event, for ``inspect`` and
    ``retry --id``; ``next_attempt_in_seconds`` when it is due again (0: due now
    or in flight).
    """

    topic: str
    retrying: int
    oldest_age_seconds: float
    event_id: int
    attempts: int
    last_error: str | None
    next_attempt_in_seconds: float

    @classmethod
    def counted(cls, topic: str, retrying: int, oldest_age_seconds: float) -> RetryingTopic:
        """A topic's retrying events as the gauges read them: how many and the oldest's age, no event named."""
        return cls(topic, int(retrying), float(oldest_age_seconds), 0, 0, None, 0.0)

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready mapping."""
        return {
            "topic": self.topic,
            "retrying": self.retrying,
            "oldest_age_seconds": round(self.oldest_age_seconds, 3),
            "event_id": self.event_id,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "next_attempt_in_seconds": round(self.next_attempt_in_seconds, 3),
        }


def oldest_of(topics: Iterable[RetryingTopic]) -> float:
    """The age of the oldest retrying event among ``topics`` (0 when there is none)."""
    return max((t.oldest_age_seconds for t in topics), default=0.0)


@dataclass(frozen=True, slots=True)
class TopicLag:
    """One topic's backlog: its pending events (not in flight, due or not) and the age of its oldest due one."""

    topic: str
    pending: int
    oldest_pending_age_seconds: float

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready mapping."""
        return {
            "topic": self.topic,
            "pending": self.pending,
            "oldest_pending_age_seconds": round(self.oldest_pending_age_seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class DeadEvent:
    """A dead-lettered event as ``outbox-relay dead`` lists it."""

    id: int
    topic: str
    key: str | None
    idempotency_key: str
    attempts: int
    last_error: str | None
    #: A time no datetime holds (plain SQL may write 'infinity') as the database's text, or
    #: None for one that is no time at all (MySQL's zero date).
    created_at: datetime | str | None
    failed_at: datetime | str | None
    blocked_events: int = 0

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready mapping."""
        shown = None if undecodable(self.key) else self.key
        return {
            "id": self.id,
            "topic": self.topic,
            # JSON has no bytes: a key that is not UTF-8 is null here, and key_hex (every key's bytes in hex,
            # what --key-hex takes) tells it from no key.
            "key": shown,
            "key_hex": None if self.key is None else key_bytes(self.key).hex(),
            "idempotency_key": self.idempotency_key,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "created_at": _iso(self.created_at),
            "failed_at": _iso(self.failed_at),
            "blocks_key": shown if self.blocked_events else None,
            "blocked_events": self.blocked_events,
        }


#: The most attempts the int column holds: a claim counts on from the row's attempts, taken as at
#: least 0 and at most one below this (plain SQL may write any int there), so it never overflows.
MAX_ATTEMPTS_COUNT = 2**31 - 1


def next_attempt(attempts: int) -> int:
    """The attempts a claim gives a row that had ``attempts``: one more, within 1 and the column's range."""
    return min(max(attempts, 0), MAX_ATTEMPTS_COUNT - 1) + 1


def undecodable(value: object) -> bool:
    """Whether ``value`` is text holding bytes that are not UTF-8, as lone surrogates: a MySQL
    VARBINARY column's bytes (relay/store/mysql/admin.py, ``text``) or a command-line argument."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def key_bytes(key: str) -> bytes:
    """A key's bytes: its UTF-8, with the bytes that are not UTF-8 (held as lone surrogates) as they were."""
    return key.encode("utf-8", "surrogateescape")


def _iso(moment: datetime | str | None) -> str | None:
    return moment.isoformat() if isinstance(moment, datetime) else moment


def _refuse_empty(kind: str, everything: bool, *filters: object) -> None:
    """An operator's selection names something, or says ``all``: nothing is never read as everything."""
    if not everything and all(value is None for value in filters):
        raise ValueError(f"{kind}: an empty selection would match every event; pass all=True to mean that")


@dataclass(frozen=True, slots=True)
class RequeueFilter:
    """Which dead-lettered events to put back: by ``id``, ``topic`` and/or ``key``, or ``all``.

    An empty filter is refused (``ValueError``) rather than read as "every one";
    ``all`` is needed only when no filter is given.
    """

    id: int | None = None
    topic: str | None = None
    key: str | None = None
    all: bool = False

    def __post_init__(self) -> None:
        _refuse_empty("requeue", self.all, self.id, self.topic, self.key)


@dataclass(frozen=True, slots=True)
class RetryFilter:
    """Which retrying events to make due now: by ``id`` and/or ``topic``, or ``all``.

    An empty filter is refused (``ValueError``) rather than read as "every one".
    """

    id: int | None = None
    topic: str | None = None
    all: bool = False

    def __post_init__(self) -> None:
        _refuse_empty("retry", self.all, self.id, self.topic)


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which kept (already sent) events to send again: by time sent, ``key`` and/or ``topic``, or ``all``.

    ``since`` and ``until`` bound the time each was sent (``until`` excluded).
    An empty filter is refused (``ValueError``) rather than read as "every one";
    ``all`` is needed only when no filter is given.
    """

    since: datetime | None = None
    until: datetime | None = None
    key: str | None = None
    topic: str | None = None
    all: bool = False

    def __post_init__(self) -> None:
        _refuse_empty("replay", self.all, self.since, self.until, self.key, self.topic)


class Skipped(enum.Enum):
    """What ``skip`` did."""

    #: Marked skipped: the later events of its key flow again.
    SKIPPED = "skipped"
    #: No such event, or it is already sent or skipped.
    NOT_FOUND = "not_found"
    #: Refused: a relay holds its lease, or the lease ended so recently that a
    #: publish may still be under way (skipping it could let its key's next
    #: event overtake it at the broker).
    IN_FLIGHT = "in_flight"


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


class Store(Protocol):
    """The relay's view of the outbox table."""

    async def open(self) -> None:
        """Connect and check the table exists; raise ``StoreUnavailable`` or ``SchemaError``."""

    async def close(self) -> None:
        """Disconnect. Safe to call twice."""

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        """Lease up to ``limit`` due events, honouring per-key order.

        A key's events come as a run, in id order, to one topic. ``chain`` holds
        this relay's batches in flight whose leases still hold: a key with
        events in them goes on after the last of those (its next events marked
        ``chained``), to the same topic only. Without it, a key with an event
        in flight anywhere waits.

        With ``max_bytes`` the batch stops adding events once their payloads
        reach that many bytes; it always holds at least one. A claim that runs
        out of time raises ``ClaimTimeout``: claim fewer events, or fewer bytes.
        The events come highest priority first, except that each key's come in
        id order (see :func:`in_key_order`).
        """

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        """:meth:`claim`, returning once the database has leased the events, before they are built:
        a next claim may start, going on from :meth:`Started.tails`, while they are."""

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        """Record the outcome of a published batch, only where the lease is still ours."""

    async def renew(self, claim: Claim) -> set[int]:
        """Start the lease of the claim's events again from now; return the ids it still holds.

        For a batch that waited so long after its claim (a payload that takes
        seconds to read, a stalled process) that its lease could end before
        the publish and the settle are done. Only an event whose lease still
        holds is renewed: its claim token matches and the lease has not ended,
        on the database's clock, in the statement that renews it. An event
        another relay took over, that was dead-lettered or settled meanwhile,
        or whose lease ended (another relay's reaper may have acted on its
        key since) is not renewed and not returned.
        """

    async def release(self, claim: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Give events back unpublished, without counting the attempt.

        With ``delay_seconds`` they are due again only that much later (their
        broker is down); they stay the oldest unsent events of their keys, so
        later events of those keys keep waiting for them.
        """

    async def reap(self, *, max_attempts: int) -> int:
        """Dead-letter events whose lease expired with no attempts left."""

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a new-event notification; True if one came."""

    async def status(self) -> Status:
        """Pending, in-flight and dead-lettered counts."""

    async def gauges(self) -> Status:
        """``status`` for the relay's gauges: exact on a small table, cheap on any (estimates past a bound)."""

    async def oldest_pending_age(self) -> float:
        """Seconds since the oldest due event that no live lease holds was written; cheap at any table size."""

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the database answers now and takes writes."""


class Admin(Protocol):
    """The operator's view of the outbox table: the commands behind ``status``,
    ``dead``, ``requeue``, ``skip``, ``inspect``, ``purge`` and ``replay``.

    Every call is bounded in time: a database that stops answering raises
    ``StoreUnavailable`` instead of hanging.
    """

    async def open(self) -> None:
        """Connect and check the table exists; raise ``StoreUnavailable`` or ``SchemaError``."""

    async def close(self) -> None:
        """Disconnect. Safe to call twice."""

    async def status(self, *, topics: int = 0) -> Status:
        """Exact pending, in-flight, retrying and dead-lettered counts.

        With ``topics``, also the lag of that many topics and their retrying
        events, those with the oldest events first (``Status.topics`` and
        ``Status.retrying_topics``).
        """

    async def dead(self, limit: int = 1000, *, topic: str | None = None) -> list[DeadEvent]:
        """Dead-lettered events, oldest first, at most ``limit``; with ``topic``, of that topic only."""

    async def requeue(
        self,
        selection: RequeueFilter,
        *,
        dry_run: bool = False,
        batch_size: int = ADMIN_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> list[int]:
        """Put matching dead-lettered events back to pending, attempts reset; their ids.

        In batches of ``batch_size`` in id order, each its own transaction
        (``relay.store.batches``); ``progress`` hears of each one. With
        ``dry_run``, nothing changes: the ids are those it would put back.
        """

    async def retry_now(self, selection: RetryFilter) -> list[int]:
        """Make matching retrying events (pending, not in flight, attempts > 0) due now; their ids.

        Their attempts stay as they are: ``--max-attempts`` still bounds them.
        """

    async def skip(self, event_id: int, *, lease_grace_seconds: float, dry_run: bool = False) -> Skipped:
        """Mark one dead-lettered or waiting event skipped, releasing its key.

        An event whose lease is live, or ended less than ``lease_grace_seconds``
        ago (a relay's publish may outlast its lease), is refused: ``IN_FLIGHT``.
        The skip is its ``failed_at``: what ``purge`` ages a skipped event from.
        With ``dry_run``, what it would do, changing nothing.
        """

    async def inspect(self, event_id: int) -> dict[str, Any] | None:
        """Every column of one event by name, or None when there is no such event."""

    async def purge(
        self,
        older_than_seconds: float,
        *,
        dry_run: bool = False,
        batch_size: int = ADMIN_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> int:
        """Delete sent and skipped events older than the cut-off, in batches; how many. Unsent events are
        never touched. A sent event's age runs from its publish, a skipped one's from its skip."""

    async def replay(
        self,
        selection: ReplayFilter,
        *,
        dry_run: bool = False,
        batch_size: int = ADMIN_BATCH_SIZE,
        progress: Progress | None = None,
    ) -> list[int]:
        """Put matching kept (sent) events back to pending with their idempotency keys; their ids.

        In batches, as :meth:`requeue`."""


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
