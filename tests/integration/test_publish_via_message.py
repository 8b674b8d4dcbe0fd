"""publish(via='message') with a payload ``json`` cannot write (a ``Decimal``, a ``datetime``): refused as the
table's way refuses it, or written as the connection's own JSON dumper writes it, as the table's way writes it;
never an event whose payload is null. Through the log source (embedded PostgreSQL, wal_level=logical)."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import psycopg
import pytest

import producers
from relay.sinks.memory import MemorySink
from tests.log_support import caught_up, running, synchronous, until

PAYLOAD = {"amount": Decimal("1.50"), "n": 1}


@pytest.mark.parametrize("via", ["table", "message"])
def test_a_payload_neither_json_nor_the_connection_can_write_is_refused_before_any_sql(
    log_database: tuple[str, str], via: str
) -> None:
    url, _slot = log_database
    with psycopg.connect(url) as conn:
        with pytest.raises(TypeError, match=r"payload\['amount'\] is a Decimal"):
            producers.publish(conn, "t", PAYLOAD, key="k", via=via)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE, "no SQL was sent"


@synchronous
async def test_a_payload_the_connection_s_own_dumper_writes_is_delivered_alike_both_ways(
    log_database: tuple[str, str],
) -> None:
    url, slot = log_database
    with psycopg.connect(url) as conn:
        psycopg.types.json.set_json_dumps(lambda value: json.dumps(value, default=str), conn)
        producers.publish(conn, "t", PAYLOAD, key="k", idempotency_key="row")
        producers.publish(conn, "t", PAYLOAD, key="k", idempotency_key="message", via="message")
    async with await psycopg.AsyncConnection.connect(url) as aconn:
        psycopg.types.json.set_json_dumps(lambda value: json.dumps(value, default=str), aconn)
        await producers.apublish(aconn, "t", PAYLOAD, key="k", idempotency_key="async message", via="message")
        await aconn.commit()
    sink = MemorySink()
    done = caught_up(url, slot)
    async with running(url, slot, sink):
        await until(lambda: len(sink.delivered) >= 3 and done())
        await asyncio.sleep(0.3)
    got = {event.idempotency_key: event.payload for event in sink.delivered}
    assert sorted(got) == ["async message", "message", "row"]
    assert got["message"] == got["async message"] == got["row"], "the same bytes as the jsonb column's"
    assert json.loads(got["row"]) == {"amount": "1.50", "n": 1}


@pytest.mark.parametrize(
    "dumped", ['{"n": NaN}', '{"n": "\\u0000"}', '{"n": "\\ud800"}', "not json", "[" * 40 + "]" * 40]
)
def test_what_the_connection_s_dumper_writes_is_checked_as_json_s_text_is(
    log_database: tuple[str, str], dumped: str
) -> None:
    """A message is not checked by jsonb, as the table's column is: what PostgreSQL's jsonb, MariaDB or the
    relay's decoding would refuse is refused here, before any SQL."""
    url, _slot = log_database
    with psycopg.connect(url) as conn:
        psycopg.types.json.set_json_dumps(lambda value: dumped, conn)
        with pytest.raises(ValueError, match="payload"):
            producers.publish(conn, "t", PAYLOAD, key="k", via="message")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE, "no SQL was sent"


@synchronous
async def test_big_messages_of_one_hot_non_ascii_key_arrive_byte_for_byte_and_in_order(
    log_database: tuple[str, str],
) -> None:
    # The envelope is written in one f-string now: a multi-MB payload, ~400 KB of headers and a key with
    # '/', '@', '%' and non-ASCII go through it, and through the relay, as they were published.
    url, slot = log_database
    key = "tenant/ä@ß%20-键"
    headers = {f"h{i}-é": "ü" * 2_000 for i in range(200)}
    payloads = [{"n": n, "blob": ("ø%/@" * 250_000) if n % 2 else "x", "quote": '"\\'} for n in range(4)]
    with psycopg.connect(url) as conn:
        for payload in payloads:
            producers.publish(conn, "t/ä", payload, key=key, headers=headers, via="message")
    sink = MemorySink()
    done = caught_up(url, slot)
    async with running(url, slot, sink):
        await until(lambda: len(sink.delivered) >= 4 and done(), timeout=60)
    assert [json.loads(e.payload) for e in sink.delivered] == payloads
    assert {e.key for e in sink.delivered} == {key}
    assert {e.topic for e in sink.delivered} == {"t/ä"}
    assert all(e.headers == headers for e in sink.delivered)
