"""The MySQL claim's two ways to find each key's runs choose the same events, on real MariaDB.

The claim reads with each keyed candidate whether it is its key's oldest
unsent event, and with each of its tails the key's next unsent event, and
claims a batch with no two candidates of one key from that alone; any other
batch makes it read the keys' unsent events (claim_keys). Here one
table's claims are made to take that second way every time, and must claim
what the other table's claims do, batch by batch, chained marks and all.

Ids plain SQL writes by hand (below 1, or past 2**62) are ids as any other,
to the claim's runs and to the counts of keys waiting on a schedule.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from relay.config import TableName
from relay.store.base import Claim
from relay.store.mysql import MySQLAdmin, MySQLStore
from relay.store.mysql import runs as planner
from relay.store.mysql.migrate import migrate
from tests import mysql_support

TABLES = ("outbox", "outbox_keys_read")
planner_lone_runs = planner.lone_runs


def fill(url: str, table: str) -> None:
    rng = random.Random(17)
    rows = []
    for n in range(300):
        key = rng.choice([*"abcdefghij", None])
        topic = rng.choice(["t", "t", "t", "u"])
        # Some events are due only later: they hold their key's later events back.
        later = rng.random() < 0.02
        rows.append((topic, key, f'{{"n": {n}}}', 3600 if later else 0))
    conn = mysql_support.connect(url)
    try:
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO `{table}` (topic, `key`, payload, deliver_at) "
                "VALUES (%s, %s, %s, UTC_TIMESTAMP(6) + INTERVAL %s SECOND)",
                rows,
            )
            # A dead letter parks its key.
            cur.execute(f"UPDATE `{table}` SET state = 'failed', failed_at = UTC_TIMESTAMP(6) WHERE id = 40")
        conn.commit()
    finally:
        conn.close()


async def claims(store: MySQLStore, limit: int) -> list[list[tuple[int, bool]]]:
    """Claim with up to two batches in hand, going on from them, until nothing is left to claim."""
    seen: list[list[tuple[int, bool]]] = []
    hand: list[Claim] = []
    while True:
        claim = await store.claim(limit, max_attempts=5, chain=hand)
        seen.append([(e.id, e.chained) for e in claim.events])
        if claim.events:
            hand.append(claim)
        if len(hand) > 1 or not claim.events:
            if not hand:
                return seen
            done = hand.pop(0)
            await store.settle(done, sent=[e.id for e in done.events], retry=[], dead=[])


def test_reading_the_keys_claims_what_the_lone_candidates_do(mysql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate(mysql_url, TableName.parse(TABLES[1]))
    for table in TABLES:
        fill(mysql_url, table)
    answered = []

    def lone_runs(*args: Any) -> dict[int, bool] | None:
        chosen = planner_lone_runs(*args)
        answered.append(chosen is not None)
        return chosen

    async def scenario() -> list[list[list[tuple[int, bool]]]]:
        stores = [MySQLStore(mysql_url, TableName.parse(t), owner="t", lease_seconds=30) for t in TABLES]
        try:
            for store in stores:
                await store.open()
            monkeypatch.setattr(planner, "lone_runs", lone_runs)
            by_heads = await claims(stores[0], 7)
            # The second table's claims read the keys every time (as when a candidate is no head).
            monkeypatch.setattr(planner, "lone_runs", lambda *args: None)
            return [by_heads, await claims(stores[1], 7)]
        finally:
            for store in stores:
                await store.close()

    by_heads, by_keys = asyncio.run(scenario())
    assert any(answered) and not all(answered)
    assert by_heads == by_keys
    claimed = [id for batch in by_heads for id, _ in batch]
    assert len(claimed) == len(set(claimed)) > 100
    assert any(chained for batch in by_heads for _, chained in batch), "no run went on from a batch in hand"


#: Ids plain SQL may write by hand below 1 (0 too, under NO_AUTO_VALUE_ON_ZERO), as on PostgreSQL
#: (tests/integration/test_pg_ids_by_hand.py). The claim took 0 for "no earlier event of the key".
IDS_BELOW_1 = [-(2**63), -5, -1, 0]


@pytest.mark.parametrize("first", IDS_BELOW_1)
def test_a_key_whose_event_in_flight_has_an_id_below_1_waits_for_it_in_another_relay(
    mysql_url: str, first: int
) -> None:
    conn = mysql_support.connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_AUTO_VALUE_ON_ZERO')")
            cur.execute(
                "INSERT INTO outbox (id, topic, `key`, payload) VALUES (%s, 't', 'k', '{}'), (%s, 't', 'k', '{}')",
                (first, first + 2),
            )
            cur.execute("INSERT INTO outbox (topic, `key`, payload) VALUES ('t', 'j', '{}')")
    finally:
        conn.close()

    async def scenario() -> list[list[int]]:
        one, other = (MySQLStore(mysql_url, TableName.parse("outbox"), owner=o, lease_seconds=30) for o in "ab")
        try:
            await one.open()
            await other.open()
            head = await one.claim(1, max_attempts=5)
            # The key's first event is in flight with the first relay: the second takes none of the key's.
            meanwhile = await other.claim(10, max_attempts=5)
            await one.settle(head, sent=[e.id for e in head.events], retry=[], dead=[])
            after = await other.claim(10, max_attempts=5)
            return [[e.id for e in claim.events] for claim in (head, meanwhile, after)]
        finally:
            await one.close()
            await other.close()

    head, meanwhile, after = asyncio.run(scenario())
    assert head == [first]
    assert first + 2 not in meanwhile and len(meanwhile) == 1  # the other key's event only
    assert after == [first + 2]


#: A key's first ids written by hand anywhere in the bigint range; status took 2**62 for "no
#: event in that state", so a key whose events all had larger ids was not seen waiting.
FIRST_IDS = [-(2**63), 7, 2**62 + 10, 2**63 - 3]


@pytest.mark.parametrize("first", FIRST_IDS)
def test_status_and_gauges_see_a_key_waiting_on_its_schedule_whatever_its_ids(mysql_url: str, first: int) -> None:
    mysql_support.execute(
        mysql_url,
        "INSERT INTO outbox (id, topic, `key`, payload, deliver_at) VALUES "
        "(%s, 't', 'k', '{}', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR), (%s, 't', 'k', '{}', UTC_TIMESTAMP(6))",
        (first, first + 1),
    )

    async def counts() -> list[tuple[int, int]]:
        admin = MySQLAdmin(mysql_url, TableName.parse("outbox"))
        store = MySQLStore(mysql_url, TableName.parse("outbox"), owner="t", lease_seconds=30)
        try:
            await admin.open()
            await store.open()
            shown = [await admin.status(), await store.gauges()]
        finally:
            await admin.close()
            await store.close()
        return [(s.scheduled, s.keys_waiting_on_schedule) for s in shown]

    assert asyncio.run(counts()) == [(1, 1), (1, 1)]
