"""The RabbitMQ sink's packed Basic.Publish frames are byte for byte what pika's basic_publish sends."""

from __future__ import annotations

from datetime import UTC, datetime

import pika
import pytest
from pika import frame, spec

from relay.events import Event
from relay.sinks.rabbitmq import publish_frames

BODY_MAX = 131_072 - 8  # RabbitMQ's default frame_max less a frame's header and end


def event(
    topic: str, payload: bytes, headers: dict[str, str], idempotency_key: str = "k-1", content_type: str | None = None
) -> Event:
    return Event(1, topic, "key", payload, headers, idempotency_key, 1, datetime.now(UTC), content_type=content_type)


def pika_frames(channel: int, exchange: str, e: Event, body_max: int) -> bytes:
    """What ``channel.basic_publish`` marshals for the sink's messages (pika.connection._send_message).

    An empty payload without a content type is no JSON: no ``content_type`` at all."""
    properties = pika.BasicProperties(
        content_type=e.content_type or ("application/json" if e.payload else None),
        delivery_mode=2,
        message_id=e.idempotency_key,
        headers=e.message_headers(),
    )
    publish = spec.Basic.Publish(exchange=exchange, routing_key=e.topic, mandatory=True)
    frames = [frame.Method(channel, publish).marshal(), frame.Header(channel, len(e.payload), properties).marshal()]
    for start in range(0, len(e.payload), body_max):
        frames.append(frame.Body(channel, e.payload[start : start + body_max]).marshal())
    return b"".join(frames)


@pytest.mark.parametrize(
    "e",
    [
        event("orders", b'{"id": 1}', {}),
        event("orders.créées", '{"é": "ß"}'.encode(), {"trace-id": "abc", "note": "ünïcode ✓"}, "idem-ü"),
        event("big", b"x" * (3 * BODY_MAX + 17), {"a": ""}),
        event("exact", b"y" * BODY_MAX, {}),
        event("empty", b"", {}),
        event("t" * 255, b"{}", {"h" * 255: "v" * 70_000}, "i" * 255),
        event("bytes", b"\x00\xff\xc3\x28", {"a": "b"}, content_type="application/x-protobuf"),
        event("empty-bytes", b"", {}, content_type="c" * 255),
        event("empty-with-headers", b"", {"content-type": "text/plain", "h": "v"}),
    ],
    ids=[
        "plain",
        "unicode",
        "several-body-frames",
        "one-full-body-frame",
        "empty-body",
        "longest-names",
        "bytes",
        "empty-bytes-longest-content-type",
        "empty-with-headers",
    ],
)
@pytest.mark.parametrize(("channel", "exchange"), [(1, ""), (65_535, "events.topic")])
def test_the_frames_are_pikas_byte_for_byte(e: Event, channel: int, exchange: str) -> None:
    assert publish_frames(channel, exchange, e, BODY_MAX) == pika_frames(channel, exchange, e, BODY_MAX)


def test_a_name_too_long_for_a_short_string_is_refused_before_anything_is_built() -> None:
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        publish_frames(1, "", event("é" * 128, b"{}", {}), BODY_MAX)  # 256 bytes in UTF-8
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        publish_frames(1, "", event("t", b"{}", {"n" * 256: "v"}), BODY_MAX)
