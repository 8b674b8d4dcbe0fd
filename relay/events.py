"""What flows between the store and the sinks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

IDEMPOTENCY_HEADER = "idempotency-key"
#: Why an event with an empty topic is dead-lettered. The native tables refuse one; a Debezium
#: row gets one from a null aggregatetype, or an empty one with --topic-template {aggregatetype}.
EMPTY_TOPIC = (
    "the topic is empty (from a Debezium table: its aggregatetype is null or empty): "
    "no Kafka topic or CloudEvents type can be empty, and no route is meant for it"
)


def is_idempotency_header(name: str) -> bool:
    """Whether ``name`` is ``idempotency-key`` in any case: a row's header of that name gives way
    to the relay's, since consumers often look headers up without regard to case."""
    return len(name) == len(IDEMPOTENCY_HEADER) and name.lower() == IDEMPOTENCY_HEADER


TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


def trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context among a row's headers: ``traceparent`` and ``tracestate``, by those
    lower-case names, whatever the case of the row's (empty values left out).

    HTTP and W3C Trace Context header names are case-insensitive, and a JSON
    object may hold one name in several cases. Only ASCII letters fold: a name
    that only Unicode case folding makes one of these (a long s, U+017F, for
    the s of ``tracestate``) is no header name. A ``traceparent`` given in
    several cases with different values is invalid (W3C: a duplicated
    ``traceparent``), and so is the whole context: none. Several ``tracestate``
    entries are joined with commas, in the row's order, as repeated header
    fields are (RFC 9110, 5.3).
    """
    parents: list[str] = []
    states: list[str] = []
    for name, value in headers.items():
        if value and len(name) in (10, 11) and name.isascii():
            lower = name.lower()
            if lower == TRACEPARENT:
                parents.append(value)
            elif lower == TRACESTATE:
                states.append(value)
    if len(set(parents)) > 1:
        return {}
    found = {TRACEPARENT: parents[0]} if parents else {}
    if states:
        found[TRACESTATE] = ",".join(states)
    return found


@dataclass(slots=True)
class Event:
    """One claimed outbox row, ready to publish. Treat it as read-only.

    ``payload`` is the row's JSON already encoded as UTF-8, so sinks forward it
    without parsing it again. (Not frozen: a frozen dataclass's ``__init__``
    costs several times more, and the relay builds one per event.)
    """

    id: int
    topic: str
    key: str | None
    payload: bytes
    headers: dict[str, str]
    idempotency_key: str
    attempts: int
    created_at: datetime
    #: An earlier event of its key is in flight (claimed by this relay, in this
    #: batch or one before it, not settled yet): it may reach the broker only if
    #: that one is acknowledged. See :class:`relay.holds.KeyHolds`.
    chained: bool = False
    #: None: ``payload`` is JSON, encoded as UTF-8 (``application/json``). Otherwise
    #: ``payload`` holds raw bytes of this content type.
    content_type: str | None = None

    def message_headers(self) -> dict[str, str]:
        """The headers a broker message carries: the row's plus the idempotency key (in place of
        a row header of that name in any case, so that a message carries one, the relay's)."""
        headers = self.headers
        if any(map(is_idempotency_header, headers)):
            headers = {name: value for name, value in headers.items() if not is_idempotency_header(name)}
        return {**headers, IDEMPOTENCY_HEADER: self.idempotency_key}

    def message_header_pairs(self) -> list[tuple[str, str | bytes | None]]:
        """:meth:`message_headers` as (name, value) pairs, the form Kafka clients take."""
        if not self.headers:  # the common case, on the hot path
            return [(IDEMPOTENCY_HEADER, self.idempotency_key)]
        return list(self.message_headers().items())


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a broker did not acknowledge an event.

    ``permanent`` failures (message too large, unknown topic, not authorised,
    unroutable with no chance of a queue appearing) are dead-lettered at once;
    the others are retried with backoff until the attempts run out.

    ``unavailable`` means the event was not even tried because the broker of
    its route is down (see :mod:`relay.sinks.routing`): the relay gives it back
    without spending an attempt, due again in ``retry_after_seconds``.
    """

    error: str
    permanent: bool = False
    unavailable: bool = False
    retry_after_seconds: float = 0.0
    #: No acknowledgement came within the publish timeout: the broker may have the event.
    timed_out: bool = False
    #: Not tried: an earlier event of its key was not acknowledged (see
    #: :class:`relay.holds.KeyHolds`). Given back at once with no attempt spent;
    #: the earlier event blocks its key in the table until it goes.
    held: bool = False


#: The outcome of an event a sink did not try because its key is held.
HELD = Failure("not published: an earlier event of its key was not acknowledged", held=True)


#: The outcome of publishing one event: ``None`` when the broker acknowledged it.
Outcome = Failure | None
