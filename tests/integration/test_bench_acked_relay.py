"""The benchmark's commit-to-ack probe: the real CLI, stamping each event when claimed and when acknowledged."""

from __future__ import annotations

import time

import psycopg

import producers
from bench.relayproc import RelayProcess
from tests.integration.kafka_support import unique_topic


def test_the_acked_relay_stamps_every_event_once_when_claimed_and_when_acknowledged(
    database_url: str, kafka_bootstrap: str
) -> None:
    topic = unique_topic("bench-acks")
    before = time.monotonic()
    with RelayProcess(database_url, f"kafka://{kafka_bootstrap}", note_acks=True) as relay:
        with psycopg.connect(database_url, autocommit=True) as conn:
            keys = []
            for i in range(20):
                with conn.transaction():
                    keys.append(producers.publish(conn, topic, {"i": i}, key=f"k{i % 3}"))
            deadline = time.monotonic() + 30
            while conn.execute("SELECT count(*) FROM outbox").fetchone() != (0,):
                assert time.monotonic() < deadline, "the relay did not drain the outbox"
                time.sleep(0.05)
        assert relay.stop() == 0
        after = time.monotonic()
        stamps = relay.stamps()
        relay.discard_log()
    acked, claimed = stamps["acked"], stamps["claimed"]
    assert sorted(acked) == sorted(keys)
    assert sorted(claimed) == sorted(keys)
    assert all(before < claimed[key] <= acked[key] < after for key in keys)
