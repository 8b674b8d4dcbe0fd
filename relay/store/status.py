"""The counts an operator and the gauges read from a store (:class:`Status`): pending, in flight,
retrying and dead-lettered events, per topic too, and what "retrying" means (:func:`is_retrying`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any


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
