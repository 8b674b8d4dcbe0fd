"""A MySQL claim of big events reads about its byte cap of payloads, not its batch size of them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from relay.config import TableName
from relay.store.mysql import MySQLStore
from tests import mysql_support
from tests.integration.kafka_support import consume, unique_topic
from tests.relay_support import RelayThread, wait_until

MB = 1024 * 1024


def big(n: int, size: int) -> str:
    return json.dumps({"n": n, "pad": "x" * size})


async def bytes_sent(store: MySQLStore) -> int:
    """What the server has sent the store's claim connection so far."""

    async def work(cur: Any) -> int:
        await cur.execute("SHOW SESSION STATUS LIKE 'Bytes_sent'")
        return int((await cur.fetchone())[1])

    return int(await store._db.call("main", work))


@pytest.mark.parametrize("payload_bytes", [False, True])
def test_a_claim_reads_the_payloads_it_leases_and_few_others(mysql_url: str, payload_bytes: bool) -> None:
    events = 40
    rows: list[tuple[object, ...]]
    if payload_bytes:
        rows = [("t", f"k{n % 3}", None, b"\0" * MB, "application/octet-stream") for n in range(events)]
    else:
        rows = [("t", f"k{n % 3}", big(n, MB), None, None) for n in range(events)]
    insert = "INSERT INTO outbox (topic, `key`, payload, payload_bytes, content_type) VALUES (%s, %s, %s, %s, %s)"
    mysql_support.insert_many(mysql_url, insert, rows)
    store = MySQLStore(mysql_url, TableName.parse("outbox"), owner="test", lease_seconds=30)

    async def claim() -> tuple[list[int], int]:
        await store.open()
        try:
            before = await bytes_sent(store)
            got = await store.claim(2000, max_attempts=3, max_bytes=3 * MB)
            return [e.id for e in got.events], await bytes_sent(store) - before
        finally:
            await store.close()

    ids, sent = asyncio.run(claim())
    assert ids == [1, 2, 3]  # the cap: events are added while the payloads are under 3 MB
    # The three leased payloads and the other 37 rows' columns without theirs (40 MB before).
    assert 3 * MB < sent < 4 * MB, sent


def test_a_claim_reads_the_big_headers_it_leases_and_few_others(mysql_url: str) -> None:
    # Plain SQL may write headers of any size: they count toward the cap, and stay behind as big payloads do.
    rows = [("t", f"k{n % 3}", json.dumps({"h": f"{n}" + "x" * MB})) for n in range(40)]
    # MariaDB's JSON check takes this, JSON does not: dead-lettered when read after the claim chose it.
    rows[2] = ("t", "k2", '{"h": "' + "y" * MB + '", "n": 1e}')
    insert = "INSERT INTO outbox (topic, `key`, payload, headers) VALUES (%s, %s, '{}', %s)"
    mysql_support.insert_many(mysql_url, insert, rows)
    store = MySQLStore(mysql_url, TableName.parse("outbox"), owner="test", lease_seconds=30)

    async def claim() -> tuple[list[tuple[int, str]], int, int]:
        await store.open()
        try:
            before = await bytes_sent(store)
            got = await store.claim(2000, max_attempts=3, max_bytes=3 * MB)
            heads = [(e.id, e.headers["h"][:1]) for e in got.events]
            return heads, got.buried, await bytes_sent(store) - before
        finally:
            await store.close()

    heads, buried, sent = asyncio.run(claim())
    assert (heads, buried) == ([(1, "0"), (2, "1")], 1)  # 3 is the dead letter, read with them
    assert 3 * MB < sent < 4 * MB, sent  # the headers of three events, not forty


@pytest.mark.timeout(120)
def test_big_events_arrive_in_key_order_and_a_big_bad_one_parks_its_key(mysql_url: str, kafka_bootstrap: str) -> None:
    topic = unique_topic("big")
    rows = [(topic, f"k{n % 4}", big(n, 300_000), f"e{n}") for n in range(24)]
    # MariaDB's JSON check takes this, JSON does not: dead-lettered when read after the claim chose it.
    rows[9] = (topic, "k1", '{"pad": "' + "y" * 300_000 + '", "n": 1e}', "e9")
    mysql_support.insert_many(mysql_url, mysql_support.INSERT_EVENT, rows)
    with RelayThread(mysql_url, f"kafka://{kafka_bootstrap}", batch_bytes=1_000_000) as relay:
        wait_until(lambda: mysql_support.outbox_counts(mysql_url).get("failed") == 1, timeout=60)
        wait_until(lambda: mysql_support.outbox_counts(mysql_url).get("pending") == 3, timeout=60)
        received = consume(kafka_bootstrap, topic, count=20, settle_seconds=1.0)
        assert relay.error is None
    by_key: dict[bytes, list[int]] = {}
    for message in received:
        assert message.key is not None
        by_key.setdefault(message.key, []).append(json.loads(message.value)["n"])
    assert by_key == {
        b"k0": [0, 4, 8, 12, 16, 20],
        b"k1": [1, 5],  # 9 is the dead letter; 13, 17 and 21 wait behind it
        b"k2": [2, 6, 10, 14, 18, 22],
        b"k3": [3, 7, 11, 15, 19, 23],
    }
    [(error,)] = mysql_support.execute(mysql_url, "SELECT last_error FROM outbox WHERE state = 'failed'")
    assert "payload is not valid JSON" in error
