"""Ids plain SQL can write by hand: below 0, or the largest bigint.

A claim scanned from id 0, so rows below it were never claimed, and their
keys waited behind them for good with nothing to say so; a key whose last
event in flight had the largest id failed the next claim (its run would
start one past it), and every claim after it.
"""

from __future__ import annotations

import psycopg
import pytest

from relay.config import TableName
from relay.store.postgres import PostgresStore
from tests.conformance.harness import run

BIGGEST = 2**63 - 1


def store(url: str) -> PostgresStore:
    made = PostgresStore(url, TableName.parse("outbox"), owner="test", lease_seconds=30, listen=False)
    run(made.open())
    return made


@pytest.mark.parametrize("low", [-1, -5, -(2**63)])
def test_rows_below_id_0_are_claimed_and_head_their_keys(database_url: str, low: int) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("INSERT INTO outbox (id, topic, key, payload) VALUES (%s, 't', 'k', '{}')", (low,))
        conn.execute("INSERT INTO outbox (id, topic, key, payload) VALUES (%s, 't', NULL, '{}')", (low + 1,))
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}'), ('t', 'j', '{}')")
    relay = store(database_url)
    try:
        events = run(relay.claim(10, max_attempts=5)).events
    finally:
        run(relay.close())
    assert len(events) == 4
    keyed = [e.id for e in events if e.key == "k"]
    assert keyed[0] == low and keyed == sorted(keyed)  # the key's run, in id order, from the row below 0


def test_a_key_whose_event_in_flight_has_the_largest_id_does_not_fail_the_next_claim(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}'), ('t', 'k', '{}')")
        conn.execute("INSERT INTO outbox (id, topic, key, payload) VALUES (%s, 't', 'k', '{}')", (BIGGEST,))
    relay = store(database_url)
    try:
        first = run(relay.claim(10, max_attempts=5))
        assert first.events[-1].id == BIGGEST
        with psycopg.connect(database_url) as conn:
            conn.execute("INSERT INTO outbox (topic, key, payload) VALUES ('t', 'k', '{}'), ('t', 'j', '{}')")
        # The key goes on from its tail: nothing can follow the largest id, so nothing of k is taken.
        second = run(relay.claim(10, max_attempts=5, chain=[first]))
    finally:
        run(relay.close())
    assert [e.key for e in second.events] == ["j"]
