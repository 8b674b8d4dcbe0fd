"""AMQP 0-9-1 frames of one persistent, mandatory Basic.Publish, packed directly.

pika builds these in Python object by object; the sink's messages always have
the same shape, so they are packed here in one pass. A test checks the bytes
against pika's own encoding.
"""

from __future__ import annotations

import functools
import struct

from relay.events import Event
from relay.sinks.formats import AmqpEncoder, amqp_native

SHORTSTR_MAX_BYTES = 255
#: What a frame adds around its payload: type, channel and size before, the end octet after.
FRAME_OVERHEAD_BYTES = 8

_FRAME_END = b"\xce"
_FRAME_HEAD = struct.Struct(">BHI")  # type, channel, payload size
_METHOD, _HEADER, _BODY = 1, 2, 3
_BASIC_PUBLISH = struct.pack(">HHH", 60, 40, 0)  # class Basic, method Publish, reserved ticket
_MANDATORY = b"\x01"
_CONTENT_HEADER = struct.Struct(">HHQ")  # class Basic, weight 0, body size
# Property flags: content-type, headers, delivery-mode, message-id; the same less content-type.
_PROPERTY_FLAGS = struct.pack(">H", 0x8000 | 0x2000 | 0x1000 | 0x0080)
_PROPERTY_FLAGS_UNTYPED = struct.pack(">H", 0x2000 | 0x1000 | 0x0080)
_PERSISTENT = b"\x02"
_LONG = struct.Struct(">I")


def short_string(text: str) -> bytes:
    """``text`` as an AMQP short string; ``ValueError`` if over 255 bytes of UTF-8."""
    raw = text.encode()
    if len(raw) > SHORTSTR_MAX_BYTES:
        raise ValueError(f"{text[:40]!r}... is longer than {SHORTSTR_MAX_BYTES} bytes")
    return bytes((len(raw),)) + raw


def _string_table(table: dict[str, str]) -> bytes:
    parts = []
    for name, value in table.items():
        raw = value.encode()
        parts.append(short_string(name) + b"S" + _LONG.pack(len(raw)) + raw)
    body = b"".join(parts)
    return _LONG.pack(len(body)) + body


def _frame(kind: int, channel: int, payload: bytes) -> bytes:
    return _FRAME_HEAD.pack(kind, channel, len(payload)) + payload + _FRAME_END


@functools.lru_cache(maxsize=64)
def _content_type(text: str) -> bytes:
    # A sink sends few content types, again and again: each is encoded once.
    return short_string(text)


def content_header(body_size: int, content_type: str | None, headers: dict[str, str], message_id: str) -> bytes:
    """The payload of a content-header frame: body size and properties, headers included
    (``content_type`` only when not None)."""
    typed = _PROPERTY_FLAGS_UNTYPED if content_type is None else _PROPERTY_FLAGS + _content_type(content_type)
    properties = typed + _string_table(headers) + _PERSISTENT + short_string(message_id)
    return _CONTENT_HEADER.pack(60, 0, body_size) + properties


def check_header_fits(size: int, payload_max: int) -> None:
    """``ValueError`` if a content header of ``size`` bytes exceeds the negotiated frame size.

    Only a body is split over several frames; RabbitMQ closes the connection
    (501 frame_too_large) on a content header larger than ``frame_max``.
    """
    if size > payload_max:
        raise ValueError(
            f"message properties and headers of {size} bytes do not fit the "
            f"{payload_max + FRAME_OVERHEAD_BYTES}-byte frame the broker negotiated (frame_max): shorten the headers"
        )


def publish_frames(
    channel: int, exchange: str, event: Event, body_max: int, encode: AmqpEncoder = amqp_native
) -> bytes:
    """The frames pika's ``basic_publish`` sends for ``event``: persistent, mandatory,
    ``message_id`` the idempotency key, and the body, ``content_type`` and headers
    that ``encode`` (the sink's format, :mod:`relay.sinks.formats`) gives.

    ``body_max`` is the negotiated frame size less a frame's overhead; ``ValueError``
    if a name is too long for AMQP or the properties do not fit one frame."""
    method = _BASIC_PUBLISH + short_string(exchange) + short_string(event.topic) + _MANDATORY
    body, content_type, headers = encode(event)
    header = content_header(len(body), content_type, headers, event.idempotency_key)
    check_header_fits(len(header), body_max)
    frames = [_frame(_METHOD, channel, method), _frame(_HEADER, channel, header)]
    frames.extend(_frame(_BODY, channel, body[start : start + body_max]) for start in range(0, len(body), body_max))
    return b"".join(frames)
