"""What the operator's commands (the ``Admin`` port) take and give: a dead letter as ``dead`` lists it
(:class:`DeadEvent`), the selections of ``requeue``, ``retry`` and ``replay`` (never empty by accident),
what ``skip`` did, and how a key that is not UTF-8 is shown."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from relay.stored_text import has_lone_surrogate


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


def undecodable(value: object) -> bool:
    """Whether ``value`` is text holding bytes that are not UTF-8, as lone surrogates: a MySQL
    VARBINARY column's bytes (relay/store/mysql/admin.py, ``text``) or a command-line argument."""
    return isinstance(value, str) and has_lone_surrogate(value)


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
