"""What RabbitMQ refuses in a message, checked before it is sent.

An event the broker would refuse by closing the channel (or the connection)
must fail on its own, as a permanent failure, instead of taking its batch
down with it; these checks decide that without a round trip.
"""

from __future__ import annotations

from collections.abc import Callable

from relay.events import EMPTY_TOPIC, Event
from relay.sinks.rabbitmq.frames import SHORTSTR_MAX_BYTES

#: Headers RabbitMQ itself reads on a published message; like RabbitMQ, the
#: names are case-sensitive. CC and BCC add routes and must be arrays (a string
#: one closes the channel); the broker and its plugins write the rest when they
#: dead-letter, federate, redeliver or convert a message, and expect their own
#: types there. Every other header, x-* included (X-Request-ID, x-match,
#: x-stream-filter-value), and cc or Bcc, is the application's.
RESERVED_HEADERS = frozenset({"CC", "BCC", "x-death", "x-received-from", "x-delivery-count", "x-mqtt-publish-qos"})
RESERVED_HEADER_PREFIXES = ("x-first-death-", "x-last-death-", "x-amqp-1.0-")
RESERVED = (
    "reserved by RabbitMQ (CC and BCC add routes; x-death and the other x- headers RabbitMQ writes itself"
    " are the broker's own)"
)


def reserved(name: str) -> bool:
    """True if RabbitMQ itself reads a header ``name`` (case-sensitive, as RabbitMQ)."""
    return name in RESERVED_HEADERS or name.startswith(RESERVED_HEADER_PREFIXES)


def refusal(event: Event, max_message_bytes: int, body_bytes: Callable[[Event], int] | None = None) -> str | None:
    """Why ``event`` can never be published as it is, or None.

    ``body_bytes`` is the size of the body the sink's format makes of an event
    (a CloudEvents envelope is larger than the payload it carries); without it,
    the payload is the body."""
    for name in event.headers:
        if reserved(name):
            return f"header {name!r} is {RESERVED}; rename it"
        if too_long(name):
            return f"header name {name[:40]!r}... is longer than {SHORTSTR_MAX_BYTES} bytes"
    if not event.topic:
        return EMPTY_TOPIC
    if too_long(event.topic):
        return f"topic (routing key) is longer than {SHORTSTR_MAX_BYTES} bytes"
    if too_long(event.idempotency_key):
        return f"idempotency key (message_id) is longer than {SHORTSTR_MAX_BYTES} bytes"
    if len(event.payload) > max_message_bytes:
        return too_large(len(event.payload), max_message_bytes)
    if body_bytes is not None and (size := body_bytes(event)) > max_message_bytes:
        return too_large(size, max_message_bytes, what="message body (the payload in its CloudEvents envelope)")
    return None


def too_long(text: str) -> bool:
    """True if ``text`` does not fit an AMQP short string (255 bytes of UTF-8)."""
    # A character takes at most 4 bytes: short names are decided without encoding.
    return len(text) > SHORTSTR_MAX_BYTES // 4 and len(text.encode()) > SHORTSTR_MAX_BYTES


def too_large(size: int, max_bytes: int, *, what: str = "payload") -> str:
    """The failure text of a payload (or body) over the broker's max message size."""
    return f"{what} of {size} bytes is larger than the broker's max message size of {max_bytes} bytes"
