"""The log source bench's floors (bench/log_source.py): L_log_kafka, L_log_kafka_headers and
L_log_kafka_contract produce every insert of the slot, with the idempotency-key header and the rows deleted
only where asked."""

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


@pytest.fixture
def seeded(logical_server: str) -> str:
    """A new database with the outbox table, its publication and slot, and EVENTS rows over 1,000 keys."""
    url = log_source._database(logical_server, f"floor_{uuid.uuid4().hex[:10]}", slot=True)
    log_source._seed(url, EVENTS, 1000)
    return url


@pytest.mark.parametrize(
    ("headers", "deletes"),
    [(False, False), (True, False), (True, True)],
    ids=["L_log_kafka", "L_log_kafka_headers", "L_log_kafka_contract"],
)
def test_a_floor_produces_every_insert_with_the_header_and_deletes_it_as_asked(
    seeded: str, kafka_bootstrap: str, headers: bool, deletes: bool
) -> None:
    with psycopg.connect(seeded) as conn:
        rows = conn.execute("SELECT key, payload::text, idempotency_key FROM outbox ORDER BY id").fetchall()
    topic = unique_topic("floor")

    result = asyncio.run(
        log_source._l_log_kafka(seeded, kafka_bootstrap, EVENTS, headers=headers, deletes=deletes, topic=topic)
    )

    assert result["rate"] > 0
    received = consume(kafka_bootstrap, topic, count=EVENTS)
    assert len(received) == EVENTS
    sent = sorted((m.key.decode() if m.key else None, m.value.decode()) for m in received)
    assert sent == sorted((key, payload) for key, payload, _ in rows)
    with psycopg.connect(seeded) as conn:
        left = conn.execute("SELECT count(*) FROM outbox").fetchone()
    if headers:
        by_payload = {payload: idempotency_key for _, payload, idempotency_key in rows}
        assert all(m.headers[IDEMPOTENCY_HEADER].decode() == by_payload[m.value.decode()] for m in received)
    else:
        assert all(IDEMPOTENCY_HEADER not in m.headers for m in received)
    assert left == ((0,) if deletes else (EVENTS,))
