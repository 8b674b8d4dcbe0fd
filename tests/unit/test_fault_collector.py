"""The fault suite's Kafka collector drops what it reads twice and counts what it skips."""

from __future__ import annotations

from tests.faults.checker import KafkaCollector, Verdict
from tests.faults.conftest import result_entry


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


def test_a_recorded_result_carries_what_the_collectors_said_while_it_ran() -> None:
    verdict = Verdict(
        committed=5, rolled_back=1, delivered=5, lost=0, leaked=0, unexpected=0, duplicates=0, order_violations=0
    )
    quiet = result_entry("s", "t", verdict, runs=1, events=None, note="3 kills", collector=[])
    assert (quiet["note"], quiet["collector"], quiet["events"]) == ("3 kills", [], 5)
    said = ["the live consumer missed 2; a fresh read of the topic found 2 of them in the broker; no errors"]
    noisy = result_entry("s", "t", verdict, runs=1, events=None, note="3 kills", collector=said)
    assert noisy["note"] == f"3 kills; collector: {said[0]}"
    assert noisy["collector"] == said
    bare = result_entry("s", "t", None, runs=1, events=7, note="", collector=said * 2)
    assert bare["note"] == f"collector: {said[0]}; collector: {said[0]}"
    assert (bare["events"], bare["lost"]) == (7, 0)
