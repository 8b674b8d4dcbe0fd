"""The fault suite's Kafka collector judges a loss against a fresh read of the broker."""

from __future__ import annotations

import json

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from tests.faults.checker import COLLECTOR_NOTES, KafkaCollector, Ledger
from tests.integration.kafka_support import unique_topic


def test_an_event_the_live_consumer_missed_is_found_and_one_never_sent_stays_lost(kafka_bootstrap: str) -> None:
    topic = unique_topic("collector")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    ledger = Ledger()
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for n in range(30):
        idem, key = f"e-{n}", f"k{n % 4}"
        ledger.committed[idem] = (key, n // 4 + 1)
        body = json.dumps({"key": key, "seq": n // 4 + 1}).encode()
        producer.produce(topic, body, key, headers=[("idempotency-key", idem.encode())])
    assert producer.flush(30) == 0
    noted = len(COLLECTOR_NOTES)
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        collector.wait_for(lambda ds: len(ds) >= 30, timeout=30)
        assert collector.verdict(ledger).lost == 0
        assert collector.note == ""
        # As if the live consumer had missed two messages: the broker still has them.
        with collector._lock:
            collector.deliveries = [d for d in collector.deliveries if d.idempotency_key not in ("e-3", "e-17")]
        result = collector.verdict(ledger)
        assert (result.lost, result.delivered, result.order_violations) == (0, 30, 0)
        assert "missed 2; a fresh read of the topic found 2" in collector.note
        # What the scenario records (tests/faults/conftest.py) carries it, though the verdict passed.
        assert COLLECTOR_NOTES[noted:] == [collector.note]
        # A committed event the broker never got is a loss whatever the re-read says.
        ledger.committed["never-sent"] = ("k9", 1)
        assert collector.verdict(ledger).lost == 1
        assert "missed 3; a fresh read of the topic found 2 of them" in collector.note
