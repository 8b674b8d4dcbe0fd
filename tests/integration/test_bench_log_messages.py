"""The log source bench's drain of ``outbox`` messages (bench/log_source.py): the seeded messages are
``_seed``'s events, and both their floor (L_log_kafka_messages) and the relay's drain deliver every one."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from bench import log_source
from relay.events import IDEMPOTENCY_HEADER
from tests.integration.kafka_support import consume, unique_topic

pytestmark = pytest.mark.timeout(180)
EVENTS = 3_000
#: The seeded messages' topic, this module's own: the relay's drain produces to it.
TOPIC = unique_topic("bench-messages")


def _expected(server: str) -> list[tuple[str | None, str]]:
    """``_seed``'s rows of EVENTS events over 1,000 keys: key and payload's text, sorted."""
    url = log_source._database(server, f"rows_{uuid.uuid4().hex[:10]}", slot=False)
    log_source._seed(url, EVENTS, 1000)
    with psycopg.connect(url) as conn:
        return sorted(conn.execute("SELECT key, payload::text FROM outbox").fetchall())


@pytest.fixture
def seeded(logical_server: str) -> str:
    """A new database with the outbox table, its publication and slot, and EVENTS messages over 1,000 keys."""
    url = log_source._database(logical_server, f"messages_{uuid.uuid4().hex[:10]}", slot=True)
    log_source._seed_messages(url, EVENTS, 1000, topic=TOPIC)
    return url


def test_the_message_floor_produces_every_message_with_its_key_and_header(
    logical_server: str, seeded: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic("floor-messages")

    result = asyncio.run(log_source._l_log_kafka_messages(seeded, kafka_bootstrap, EVENTS, topic=topic))

    assert result["rate"] > 0
    received = consume(kafka_bootstrap, topic, count=EVENTS)
    assert len(received) == EVENTS
    # json.dumps keeps the envelope's order: jsonb's, as the SQL wrote it.
    assert sorted((m.key.decode() if m.key else None, m.value.decode()) for m in received) == _expected(logical_server)
    assert len({m.headers[IDEMPOTENCY_HEADER] for m in received}) == EVENTS


def test_the_relay_drains_every_message_as_the_rows_would_arrive(
    logical_server: str, seeded: str, kafka_bootstrap: str
) -> None:
    result = asyncio.run(log_source._drain_log(seeded, EVENTS, kafka_bootstrap, rows=False, topic=TOPIC))

    assert result["rate"] > 0
    received = consume(kafka_bootstrap, TOPIC, count=EVENTS)
    assert len(received) == EVENTS
    assert sorted((m.key.decode() if m.key else None, m.value.decode()) for m in received) == _expected(logical_server)
    with psycopg.connect(seeded) as conn:
        assert conn.execute("SELECT count(*) FROM outbox").fetchone() == (0,)
