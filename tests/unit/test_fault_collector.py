"""The fault suite's Kafka collector drops what it reads twice and counts what it skips."""

from __future__ import annotations

from tests.faults.checker import KafkaCollector


def test_a_reread_is_dropped_and_a_jump_is_counted_per_partition() -> None:
    collector = KafkaCollector("127.0.0.1:9", "t")
    kept = [
        collector._in_sequence(partition, offset)
        for partition, offset in [(0, 0), (0, 1), (1, 0), (0, 0), (0, 1), (0, 2), (1, 4), (1, 5), (1, 2)]
    ]
    assert kept == [True, True, True, False, False, True, True, True, False]
    assert collector.reread == 3
    assert dict(collector.skipped) == {1: 3}
    assert "messages read twice 3" in collector.troubles()
