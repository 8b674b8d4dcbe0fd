"""The benchmark harness's pure parts: statistics, parsing, verdicts and rendering (no servers)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import zlib
from typing import Any

import pytest

from bench import __main__ as bench_main
from bench import attribution, cpu, docs, gauges, keys, keys_report, latency, mysql, report, stats, writers
from bench.writers import connections_for, trimmed_mean

PAGE = docs.PAGE_PATH.read_text(encoding="utf-8")


def test_percentile_interpolates_between_ranks() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert stats.percentile(values, 0) == 1.0
    assert stats.percentile(values, 50) == 2.5
    assert stats.percentile(values, 100) == 4.0
    assert math.isnan(stats.percentile([], 50))
    with pytest.raises(ValueError):
        stats.percentile(values, 101)


def test_latency_summary_is_in_milliseconds() -> None:
    summary = stats.latency_summary([0.001 * i for i in range(1, 1001)])
    assert summary["n"] == 1000
    assert summary["p50_ms"] == pytest.approx(500.5)
    assert summary["p99_ms"] == pytest.approx(990.01)
    assert summary["max_ms"] == pytest.approx(1000)


def test_window_rate_counts_messages_between_the_crossing_marks() -> None:
    # 100 messages per second for 10 s, one mark per 10 messages.
    marks = [(i / 10, i * 10) for i in range(101)]
    assert stats.window_rate(marks, 1000, 0.1, 0.9) == pytest.approx(100)
    # Twice as fast in the second half.
    marks = [(t / 10, t * 10) for t in range(51)] + [(5 + t / 20, 500 + t * 10) for t in range(1, 51)]
    assert stats.window_rate(marks, 1000, 0.8, 0.9) == pytest.approx(200)
    assert stats.window_rate(marks, 1000, 0.1, 0.2) == pytest.approx(100)
    assert math.isnan(stats.window_rate(marks[:5], 1000, 0.1, 0.9))


def test_ratio_guards_missing_and_zero() -> None:
    assert stats.ratio(3, 2) == 1.5
    assert stats.ratio(None, 2) is None
    assert stats.ratio(1, 0) is None
    assert stats.ratio(math.nan, 1) is None


def test_proc_parsing() -> None:
    stat = "1234 (python -m (relay)) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 4 0 100 0 0"
    assert stats.proc_cpu_seconds(stat, 100) == pytest.approx(3.0)
    status = "Name:\tpython\nVmHWM:\t  102400 kB\nVmRSS:\t 51200 kB\n"
    assert stats.proc_status_bytes(status, "VmHWM") == 100 * 1024 * 1024
    assert stats.proc_status_bytes(status, "VmSwap") == 0


METRICS = """\
# HELP outbox_relay_claim_duration_seconds Time the claim query took.
outbox_relay_claim_duration_seconds_bucket{le="0.005"} 10.0
outbox_relay_claim_duration_seconds_bucket{le="0.01"} 30.0
outbox_relay_claim_duration_seconds_bucket{le="+Inf"} 40.0
outbox_relay_claim_duration_seconds_count 40.0
outbox_relay_claim_duration_seconds_sum 0.4
"""


def test_histogram_parsing_and_quantiles() -> None:
    name = "outbox_relay_claim_duration_seconds"
    assert stats.histogram_sum_count(METRICS, name) == (0.4, 40.0)
    assert stats.mean_between((0.1, 10.0), (0.4, 40.0)) == pytest.approx(0.01)
    buckets = stats.histogram_buckets(METRICS, name)
    assert buckets == [(0.005, 10.0), (0.01, 30.0), (math.inf, 40.0)]
    assert stats.bucket_quantile(buckets, 0.25) == pytest.approx(0.005)
    assert stats.bucket_quantile(buckets, 0.5) == pytest.approx(0.0075)
    assert stats.bucket_quantile(buckets, 0.99) == 0.01  # in +Inf: the last finite bound
    delta = stats.bucket_delta(buckets, [(0.005, 10.0), (0.01, 10.0), (math.inf, 10.0)])
    assert delta == [(0.005, 0.0), (0.01, 20.0), (math.inf, 30.0)]


def test_writer_helpers() -> None:
    assert trimmed_mean([1.0] * 99 + [100.0]) == 1.0
    assert connections_for(10) >= 2
    assert connections_for(1e9) <= 24


RESULTS = {
    "machine": {"date": "2024-01-01 00:00 UTC", "nproc": 2, "memory_gb": 24.0, "postgresql": "15.0"},
    "config": {"command": "python -m bench", "events": 200_000, "s2_seconds": 20, "s4_seconds": 60},
    "baselines": {
        "l_db": {"rate": 40_000.0},
        "l_kafka": {"rate": 30_000.0},
        "l_rmq": {"rate": 8_000.0},
        "l_commit": {"rate": 600.0},
    },
    "s1_kafka": {
        "rate": 37_000.0,
        "rate_10_20": 36_000.0,
        "rate_80_90": 35_000.0,
        "s3_ratio": 35 / 36,
        "cpu_seconds_per_1000": 0.02,
        "cpu_share_of_one_core": 0.7,
        "peak_rss_mb": 60.0,
    },
    "s1_kafka_unordered": {"rate": 40_000.0, "s3_ratio": 1.0},
    "s1_rmq": {"rate": 6_000.0, "s3_ratio": 1.0},
    "s2": {
        "notify": {
            "latency": {"p50_ms": 40.0, "p99_ms": 80.0, "p999_ms": 90.0},
            "ack_latency": {"p50_ms": 4.0, "p99_ms": 30.0, "p999_ms": 50.0},
            "achieved_rate": 300.0,
            "offered_rate": 300.0,
            "throughput": 300.0,
            "lost": 0,
        }
    },
    "s4": {
        "claim_ratio": 1.5,
        "claim_ratio_last_10s": 1.8,
        "claim_mean_ms_before": 2.0,
        "claim_mean_ms_during": 3.0,
        "throughput_during": 290.0,
        "throughput_before": 300.0,
        "n_dead_tup_before": 10,
        "n_dead_tup_during": 5000,
        "lost": 0,
        "not_received": 0,
        "duplicates": 0,
    },
    "writer_cost": {
        "rates": {"plain": 600.0, "publish_notify": 500.0, "publish_no_notify": 550.0},
        "publish_overhead_notify": 0.2,
        "publish_overhead_no_notify": 600 / 550 - 1,
    },
    "errors": {},
}


def test_targets_are_judged_from_the_figures() -> None:
    verdicts = {v["target"]: v for v in report.evaluate(RESULTS)}
    assert verdicts["Kafka S1 >= 0.9 x L_db"]["met"] is True
    assert verdicts["Kafka S1 >= 0.9 x L_db"]["value"] == pytest.approx(0.925)
    assert verdicts["RabbitMQ S1 >= 0.9 x L_rmq"]["met"] is False
    # Judged on commit-to-ack, not on commit-to-consume (which adds the broker's hand-over).
    assert verdicts["S2 commit-to-ack p50 <= 5 ms (NOTIFY on)"]["met"] is True
    assert verdicts["S2 commit-to-ack p99 <= 25 ms (NOTIFY on)"]["met"] is False
    assert verdicts["publish() adds <= 10% (NOTIFY on)"]["met"] is False
    assert verdicts["ordered >= 0.8 x unordered"]["met"] is True
    assert verdicts["S4 nothing lost (every committed event received)"]["met"] is True
    partial = report.evaluate({"baselines": {}})
    assert all(v["met"] is None and v["shown"] == "not run" for v in partial)


def test_table_and_page_render() -> None:
    table = report.format_table(RESULTS)
    assert "0.93 x L_db" in table
    assert "MISSED" in table and "met" in table
    page = docs.render({**RESULTS, "profile": {"date": "x", "events": 10, "notes": ["a finding"]}}, PAGE)
    assert page.startswith("# Performance")
    assert "| Kafka S1 >= 0.9 x L_db | 0.925x | yes |" in page
    assert "- a finding" in page
    assert "make bench" in page


def test_stacks_are_sorted_into_phases() -> None:
    text = (
        "thread (1): MainThread;run (a.py:1);PostgresStore.claim (p.py:1);PostgresStore._fetch (p.py:2);"
        "AsyncCursor.fetchall (c.py:3) 6\n"
        "thread (1): MainThread;run (a.py:1);Deliveries.judge (l.py:1);Histogram.observe (m.py:1) 2\n"
        "thread (2): kafka-produce_0;KafkaSink._produce_all (k.py:1) 2\n"
    )
    by_category, by_thread, samples = attribution.categorize_collapsed(text)
    assert samples == 10
    assert by_category["claim: row decoding (psycopg fetchall, jsonb json.loads)"] == pytest.approx(0.6)
    assert by_category["metrics (prometheus_client, per event)"] == pytest.approx(0.2)
    assert by_thread == {"MainThread": pytest.approx(0.8), "kafka-produce": pytest.approx(0.2)}


def test_subplan_times_split_a_plan() -> None:
    plan = {
        "Actual Total Time": 50.0,
        "Plans": [
            {
                "Subplan Name": "CTE candidates",
                "Actual Total Time": 20.0,
                "Actual Loops": 1,
                "Plans": [{"Subplan Name": "SubPlan 1", "Actual Total Time": 0.01, "Actual Loops": 1000}],
            }
        ],
    }
    parts = attribution.subplan_times(plan)
    assert parts["CTE candidates"] == 20.0
    assert parts["SubPlan 1"] == pytest.approx(10.0)
    assert parts["outside CTEs"] == 30.0


def _case(name: str, status_ms: float, gauges_ms: float, **extra: Any) -> dict[str, Any]:
    counts = {"pending": 1000, "in_flight": 0, "failed": 0, "parked_keys": 0, "oldest_pending_age_seconds": 1.0}
    explained = {"execution_ms": 1.0, "planning_ms": 0.1, "shared_hit": 10, "shared_read": 0, "workers": 0}
    return {
        "name": name,
        "mixed": False,
        "seed": {"table_mb": 80.0, "indexes_mb": 20.0},
        "calls": {
            "status": {"median_ms": status_ms, "value": counts},
            "gauges": {"median_ms": gauges_ms, "value": counts},
            "oldest_pending_age": {"median_ms": 0.2, "value": 1.0},
        },
        "explain": {"status": {**explained, "scans": ["Seq Scan, 1,000 rows"]}},
        **extra,
    }


COUNTS_950K = {"pending": 950_000, "in_flight": 0, "failed": 0, "parked_keys": 0}
GAUGES = {
    "date": "2024-01-01 00:00 UTC",
    "source": "abc1234",
    "exact_up_to": 20_000,
    "repeats": 7,
    "budget_ms": 50.0,
    "cases": [
        _case("100,000 unsent", 40.0, 9.0),
        _case(
            "1,000,000 unsent",
            420.0,
            10.0,
            index_build_seconds=0.7,
            churn=[{"step": "after ANALYZE", "status": {**COUNTS_950K}, "gauges": {**COUNTS_950K}}],
        ),
        _case("1,000,000: half in flight", 450.0, 15.0, mixed=True),
    ],
}


def test_plan_summary_says_what_a_query_read_of_the_outbox() -> None:
    explained = {
        "Execution Time": 12.5,
        "Planning Time": 0.4,
        "Plan": {
            "Node Type": "Aggregate",
            "Shared Hit Blocks": 100,
            "Shared Read Blocks": 7,
            "Plans": [
                {"Node Type": "Gather", "Workers Launched": 2, "Plans": [
                    {"Node Type": "Parallel Seq Scan", "Relation Name": "outbox", "Actual Rows": 100.0,
                     "Actual Loops": 3},
                ]},
                {"Node Type": "Index Only Scan", "Relation Name": "outbox", "Index Name": "outbox_failed_idx",
                 "Actual Rows": 2.0, "Actual Loops": 1, "Heap Fetches": 0},
                {"Node Type": "Index Scan", "Relation Name": "pg_class", "Actual Rows": 1.0, "Actual Loops": 1},
            ],
        },
    }  # fmt: skip
    summary = gauges.plan_summary(explained)
    assert summary["execution_ms"] == 12.5 and summary["workers"] == 2
    assert (summary["shared_hit"], summary["shared_read"]) == (100, 7)
    assert summary["scans"] == [
        "Parallel Seq Scan, 300 rows",
        "Index Only Scan using outbox_failed_idx, 2 rows, 0 heap fetches",
    ]


def test_the_gauges_section_renders_and_a_partial_run_replaces_only_it() -> None:
    text = docs.gauges_text(GAUGES)
    assert "| 1,000,000 unsent | 80 + 20 MB | 420.0 ms | 10.0 ms | 0.20 ms |" in text
    assert "40 ms on 100,000 unsent, 420 ms on 1,000,000 unsent." in text
    assert "at most 15.0 ms on these tables, within the budget of 50 ms" in text
    assert "would take some 0 relays" in text  # the mixed case's counts are the defaults here
    assert "| 1,000,000 unsent, after ANALYZE | 950,000 / 0 / 0 / 0 | 950,000 / 0 / 0 / 0 |" in text
    assert "took 0.7 s" in text
    page = docs.render({**RESULTS, "gauges": GAUGES}, PAGE)
    assert text in page and page.index(text) < page.index("## Reproduce")
    replaced = docs.fill(page, {"gauges": "NEW GAUGES"})
    assert "NEW GAUGES" in replaced and "420.0 ms" not in replaced
    assert replaced.replace("NEW GAUGES", text) == page


MYSQL: dict[str, Any] = {
    "events": 50_000,
    "keys": 5_000,
    "target_ratio": 0.8,
    "server": "10.11.19-MariaDB",
    "l_db_mysql_runs": [30_000.0, 34_000.0],
    "l_db_mysql": 32_000.0,
    "keyed": {"rows_per_second": 6_400.0, "seconds": 7.8, "mean_claim_ms": 230.0, "ratio": 0.2},
    "null_keys": {"rows_per_second": 25_600.0, "seconds": 2.0, "mean_claim_ms": 120.0, "ratio": 0.8},
    "l_steps_mysql_runs": [15_000.0, 17_000.0],
    "l_steps_mysql": 16_000.0,
    "l_steps_ratio": 0.5,
}


def test_the_mysql_scenario_reports_both_drains_against_l_db_mysql_with_their_targets() -> None:
    text = mysql.mysql_text(MYSQL)
    assert "L_db_mysql 32,000 rows/s (the mean of 30,000, 34,000, before and after the drains)" in text
    assert "| 5,000 keys | 6,400 | 0.20 | 0.40 | >= 0.8 (missed) |  |  | 230 ms |" in text
    assert "| null keys | 25,600 | 0.80 | 1.60 | >= 0.9 (met) |  |  | 120 ms |" in text
    assert "Not measured" in mysql.mysql_text(None)
    assert "L_steps_mysql 16,000 rows/s (the mean of 15,000, 17,000), **0.50 x L_db_mysql**" in text
    earlier = {k: v for k, v in MYSQL.items() if not k.startswith("l_steps")}  # a run saved before it existed
    assert "L_steps_mysql 16,000" not in mysql.mysql_text(earlier)
    assert "| null keys | 25,600 | 0.80 |  |  |  |  | 120 ms |" in mysql.mysql_text(earlier)
    verdicts = {v["target"]: v for v in report.evaluate({"mysql": MYSQL})}
    assert verdicts["MySQL Kafka drain, 5,000 keys >= 0.8 x L_db_mysql"]["met"] is False
    assert verdicts["MySQL Kafka drain, null keys >= 0.8 x L_db_mysql"]["met"] is True
    assert verdicts["Kafka S1 >= 0.9 x L_db"]["met"] is None
    assert "MySQL Kafka drain (5,000 keys)" in report.format_table({"mysql": MYSQL})
    page = docs.render({**RESULTS, "mysql": MYSQL}, PAGE)
    assert text in page and page.index("## On MySQL and MariaDB") < page.index(text)
    assert "mysql" in bench_main.DEFAULT and bench_main.OWN_SECTIONS["mysql"] == "mysql"


def test_filling_the_page_rewrites_only_its_marked_sections() -> None:
    page = (
        "# Title\n\nProse, <!-- bench:n -->1<!-- /bench:n --> of it.\n\n"
        "<!-- bench:table -->\n\nold\nrows\n\n<!-- /bench:table -->\n\nMore prose.\n"
    )
    filled = docs.fill(page, {"n": "2,000", "table": "| new |"})
    assert filled == (
        "# Title\n\nProse, <!-- bench:n -->2,000<!-- /bench:n --> of it.\n\n"
        "<!-- bench:table -->\n\n| new |\n\n<!-- /bench:table -->\n\nMore prose.\n"
    )
    assert docs.fill(filled, {"n": "2,000", "table": "| new |"}) == filled
    assert docs.fill(page, {"n": "3"}).endswith("old\nrows\n\n<!-- /bench:table -->\n\nMore prose.\n")
    with pytest.raises(ValueError, match="no section gauges"):
        docs.fill(page, {"gauges": "figures"})


def test_the_performance_page_has_every_section_a_run_fills() -> None:
    filled = docs.render(RESULTS, PAGE)  # raises for a section the page lacks
    assert docs.render(RESULTS, filled) == filled
    prose = re.compile(r"<!-- bench:([\w-]+) -->.*?<!-- /bench:\1 -->", re.S)
    assert prose.sub("", filled) == prose.sub("", PAGE), "a run changed the page outside its sections"


def test_machine_cpu_per_event_splits_the_busy_time_by_group() -> None:
    start = cpu.Snapshot(at=10.0, busy=100.0, steal=1.0, groups=dict.fromkeys(("relay", "postgres", "bench"), 0.0))
    end = cpu.Snapshot(
        at=12.0, busy=103.0, steal=1.4, groups={"relay": 1.0, "postgres": 1.5, "bench": 0.25}
    )  # 3 CPU-seconds busy over 2 s of wall time
    result = cpu.per_event(start, end, 1000)
    assert result["machine_us_per_event"] == pytest.approx(3000)
    assert result["groups_us_per_event"] == pytest.approx({"relay": 1000, "postgres": 1500, "bench": 250, "other": 250})
    cpus = os.cpu_count() or 1
    assert result["machine_busy_share"] == pytest.approx(1.5 / cpus)
    assert result["steal_share"] == pytest.approx(0.2 / cpus)
    assert cpu.per_event(start, end, 0) == {}
    value, note = report._machine_cpu(result)
    assert value == "3000.0 us"
    assert note.startswith("relay 1000.0, PostgreSQL 1500.0, bench (client or consumer) 250.0, other 250.0;")


def test_a_cpu_snapshot_counts_this_process_as_the_bench() -> None:
    before = cpu.snapshot()
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    after = cpu.snapshot()
    # /proc counts in clock ticks (10 ms) and may trail process_time by a tick or two, so leave room for that
    assert after.groups["bench"] - before.groups["bench"] >= 0.15
    assert after.busy >= before.busy


def test_a_cpu_snapshot_counts_every_relay_it_is_given_in_the_relay_group() -> None:
    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nsys.stdin.read()"
    busy = [subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE) for _ in range(2)]
    try:
        pids = [p.pid for p in busy]
        deadline = time.monotonic() + 30
        while min(cpu.snapshot(pid).groups["relay"] for pid in pids) < 0.3:
            assert time.monotonic() < deadline, "the busy children did not burn their CPU"
            time.sleep(0.05)
        one, both = cpu.snapshot(pids[0]).groups["relay"], cpu.snapshot(pids).groups["relay"]
        assert 0.3 <= one < 0.6 <= both
        assert cpu.snapshot().groups["relay"] == 0
    finally:
        for process in busy:
            process.communicate(b"")


def test_spreads_of_several_relays_drain_the_backlog_of_another_spread() -> None:
    spreads = keys.SPREADS
    for name in ("k1000x3", "hotx3"):
        spread = spreads[name]
        assert spread.relays == 3 and spread.backlog in spreads and name in keys.KAFKA_CASES
        mine = spreads[spread.backlog]
        assert [spread.key(g) for g in range(1, 3001)] == [mine.key(g) for g in range(1, 3001)]
    assert all(s.relays == 1 and s.backlog is None for s in spreads.values() if not s.name.endswith("x3"))


def test_received_before_reads_the_last_mark_at_or_before_a_time() -> None:
    marks = [(1.0, 10), (2.0, 25), (3.0, 40)]
    assert stats.received_before(marks, 0.5) == 0
    assert stats.received_before(marks, 2.0) == 25
    assert stats.received_before(marks, 2.9) == 25
    assert stats.received_before(marks, 9.0) == 40


def test_spreads_give_each_event_its_key() -> None:
    spreads = keys.SPREADS
    assert [spreads["null"].key(g) for g in (1, 2)] == [None, None]
    assert len({spreads["each"].key(g) for g in range(1, 101)}) == 100
    assert len({spreads["k1000"].key(g) for g in range(1, 5001)}) == 1000
    assert len({spreads["k4000"].key(g) for g in range(1, 8001)}) == 4000
    assert [spreads["k8"].key(g) for g in (1, 9)] == ["key-1", "key-1"]
    assert {spreads["k1"].key(g) for g in range(1, 50)} == {"key-0"}
    assert 130 <= len(keys.payload(123_456)) <= 160
    hot = [spreads["hot"].key(g) for g in range(1, 4001)]
    assert hot.count("key-hot") == 2000 and len(set(hot)) == 1001  # half on one key, the rest over 1,000
    assert spreads["k1000"].events(200_000) == 200_000


def test_the_big_payload_spread_is_smaller_incompressible_and_has_its_own_baseline() -> None:
    big = keys.SPREADS["big"]
    assert big.events(200_000) == 20_000 and big.baseline == "l_db_big"
    text = json.dumps(big.document(7))
    assert 16_384 <= len(text) <= 16_384 + 200
    assert text == json.dumps(big.document(7))  # the same backlog in every run
    assert len(zlib.compress(text.encode())) > 0.7 * len(text)  # base64 of random bytes: compression cannot halve it
    assert "blob" not in keys.SPREADS["k1000"].document(7)


KEYS: dict[str, Any] = {
    "date": "2024-01-01 00:00 UTC",
    "source": "abc1234",
    "events": 200_000,
    "cap_seconds": 120,
    "partitions": 3,
    "payload_bytes": 146,
    "load_average": {"start": 1.5, "end": 2.25},
    "baselines": {
        "l_db": {"rate": 100_000.0, "runs": [{}, {}]},
        "l_rmq": {"rate": 10_000.0, "runs": [{}, {}]},
        "l_rmq_serial": {"rate": 2_000.0, "runs": [{}, {}]},
        "l_lease": {"rate": 80_000.0, "runs": [{}, {}]},
        "l_lease_kafka": {"rate": 110_000.0, "runs": [{}, {}]},
    },
    "cases": {
        "kafka/k1000": {"rate": 95_000.0, "s3_ratio": 0.95, "cut": False, "received": 200_000},
        "kafka/k1": {"rate": 7.0, "s3_ratio": 0.5, "cut": True, "received": 840},
        "rabbitmq/k1": {"rate": 4_000.0, "s3_ratio": math.nan, "cut": False, "received": 200_000},
    },
}
BIG_KEYS = {
    **KEYS,
    "baselines": {**KEYS["baselines"], "l_db_big": {"rate": 10_000.0, "runs": [{}, {}]}},
    "cases": {
        **KEYS["cases"],
        "kafka/hot": {"rate": 50_000.0, "s3_ratio": 0.95, "cut": False, "received": 200_000},
        "kafka/big": {"rate": 5_000.0, "s3_ratio": 0.92, "cut": False, "received": 20_000},
    },
}


def test_key_distribution_cases_are_judged_against_their_baselines() -> None:
    rows = {row["case"]: row for row in keys_report.verdicts(KEYS)}
    assert list(rows) == ["Kafka, 1,000 keys", "Kafka, 1 key", "RabbitMQ, 1 key"]  # in the page's order
    assert rows["Kafka, 1,000 keys"]["over_l_db"] == pytest.approx(0.95)
    assert (rows["Kafka, 1,000 keys"]["met"], rows["Kafka, 1,000 keys"]["late_met"]) == (True, True)
    assert (rows["Kafka, 1 key"]["met"], rows["Kafka, 1 key"]["late_met"]) == (False, False)
    assert rows["RabbitMQ, 1 key"]["over_l_rmq"] == pytest.approx(0.4)
    assert rows["RabbitMQ, 1 key"]["met"] is True  # >= 0.3 x L_rmq, though 0.04 x L_db
    assert rows["RabbitMQ, 1 key"]["late_met"] is None
    text = keys_report.keys_text(KEYS)
    assert (
        "| Kafka, 1 key | 7.0/s (cut at 120 s, 840 received) | 0.000070 | 0.00070 | - | >= 0.5 x L_db | **no** |"
        in text
    )
    # Against the one-message-at-a-time ceiling too, on RabbitMQ only.
    assert rows["RabbitMQ, 1 key"]["over_l_rmq_serial"] == pytest.approx(2.0)
    assert "| RabbitMQ, 1 key | 4,000/s | 0.04 | 0.4 | 2 | >= 0.3 x L_rmq | yes |" in text
    assert "L_rmq,1 2,000/s (mean of 2 runs), 0.2 x L_rmq is the same client" in text
    assert "L_db 100,000/s (mean of 2 runs)" in text
    assert "The load average was 1.5 at the start and 2.2 at the end." in text
    assert "| Kafka, 1,000 keys | 95,000/s | 0.95 | 9.5 | - |" in text
    # The ceiling of a relay that leases each row, stated, never a row's denominator.
    assert "L_lease 80,000/s (mean of 2 runs), 0.8 x L_db, is the bare loop of a relay that leases each row" in text
    assert "L_lease,kafka 110,000/s (mean of 2 runs), 1.1 x L_db, is that loop producing each batch" in text
    without = {**KEYS, "baselines": {k: v for k, v in KEYS["baselines"].items() if k != "l_lease"}}
    assert "L_lease" not in keys_report.keys_text(without)
    assert [row["over_l_db"] for row in keys_report.verdicts(without)] == [row["over_l_db"] for row in rows.values()]


def test_hot_key_and_big_payload_cases_are_judged_against_their_own_l_db() -> None:
    rows = {row["case"]: row for row in keys_report.verdicts(BIG_KEYS)}
    hot, big = rows["Kafka, 1 hot key (half the events) and 1,000 others"], rows["Kafka, 1,000 keys, 16 KB payloads"]
    assert hot["over_l_db"] == pytest.approx(0.5) and hot["met"] is None and hot["late_met"] is True
    assert big["over_l_db"] == pytest.approx(0.5)  # over L_db,16K (10,000/s), not L_db (100,000/s)
    text = keys_report.keys_text(BIG_KEYS)
    assert "| Kafka, 1,000 keys, 16 KB payloads | 5,000/s | 0.5 |" in text
    assert "drains 20,000 events whose payloads carry 16,384 more bytes" in text
    assert "L_db,16K 10,000/s (mean of 2 runs)" in text
    assert "16 KB payloads" not in keys_report.keys_text(KEYS)


def test_relay_latency_is_the_difference_from_the_raw_client() -> None:
    raw = [{"to_consume": {"p50_ms": 30.0, "p99_ms": 60.0}}, {"to_consume": {"p50_ms": 34.0, "p99_ms": 64.0}}]
    relay = {"latency": {"p50_ms": 40.0, "p99_ms": 70.0}, "achieved_rate": 498.0, "max_behind_schedule_ms": 3.0}
    data = {"rate": 500.0, "seconds": 20.0, "raw": raw, "relay": relay}
    data["difference"] = latency.difference(data)
    assert data["difference"] == {"p50_ms": pytest.approx(8.0), "p99_ms": pytest.approx(8.0)}
    text = latency.latency_text(data)
    assert "| p50 | 40.0 ms | 30.0 and 34.0 ms | +8.0 ms | <= 3 ms | **no** |" in text
    assert "| p99 | 70.0 ms | 60.0 and 64.0 ms | +8.0 ms | <= 15 ms | yes |" in text
    assert "committed 498 events/s (3 ms behind schedule at worst)" in text
    verdicts = {v["target"]: v for v in report.evaluate({"relay_latency": data})}
    assert verdicts["relay's own latency p50 <= 3 ms"]["met"] is False
    assert verdicts["relay's own latency p99 <= 15 ms"]["met"] is True


def test_publish_is_judged_against_a_bare_insert() -> None:
    writer: dict[str, Any] = RESULTS["writer_cost"]  # type: ignore[assignment]
    cost = {
        **writer,
        "bare_insert_overhead": 0.1,
        "publish_over_bare_insert": 2.0,
        "rates": {**writer["rates"], "bare_insert": 545.0},
    }
    results = {**RESULTS, "writer_cost": cost}
    verdicts = {v["target"]: v for v in report.evaluate(results)}
    assert verdicts["publish() <= 1.5 x a bare INSERT of the same columns"]["met"] is False
    text = writers.publish_cost_text(results)
    assert "| bare INSERT of the same columns into a plain table | +10% |" in text
    assert "`publish()` adds 2.00x what the bare INSERT adds (target <= 1.5x: **no**)." in text
    page = docs.render({**results, "keys": KEYS}, PAGE)
    assert text in page and keys_report.keys_text(KEYS) in page
    assert "Not measured in this run: `python -m bench --only latency`." in page


def test_claim_shapes_fill_the_batch_and_render() -> None:
    from bench import claim_shapes
    from bench.keys import SPREADS
    from bench.services import TABLE
    from relay.store.sql import render

    for name, spread in SPREADS.items():
        shapes = claim_shapes.shapes(spread)
        assert shapes[0].name == "relay"
        for shape in shapes[1:]:  # keyed spreads with runs only: heads x run is the batch
            assert spread.keys and shape.params["heads"] * (shape.params["run"] + 1) == claim_shapes.LIMIT, name
            assert render(shape.query, TABLE).as_string(None).count("FOR UPDATE") == 2
        assert len(shapes) == (3 if spread.keys else 1)


def test_the_mysql_scenario_reports_the_keyed_floor_and_the_relay_over_it() -> None:
    keyed = {
        **MYSQL,
        "keyed": {**MYSQL["keyed"], "keyed_ratio": 0.8},
        "l_keyed_mysql_runs": {"keyed": [7_000.0, 9_000.0], "keys_8": [40.0, 56.0]},
        "l_keyed_mysql": {"keyed": 8_000.0, "keys_8": 48.0},
    }
    text = mysql.mysql_text(keyed)
    assert (
        "L_keyed_mysql: 5,000 keys 8,000 rows/s (the mean of 7,000, 9,000), 0.50 x L_steps_mysql, the relay 0.80 x it; "
        "8 keys 48 rows/s (the mean of 40, 56), 0.003 x L_steps_mysql, the relay not run." in text
    )
    # Each keyed drain's floor beside its ratio and its target, in the same row of the table.
    assert "| 5,000 keys | 6,400 | 0.20 | 0.40 | >= 0.8 (missed) |  | 0.50 | 230 ms |" in text
    assert "| null keys | 25,600 | 0.80 | 1.60 | >= 0.9 (met) |  |  | 120 ms |" in text
    assert "| 8 keys |" not in text and "L_keyed_mysql x L_steps_mysql | mean claim |" in text
    assert mysql.mysql_text({**keyed, "keys_8": {**MYSQL["keyed"]}}).count("| 0.003 | 230 ms |") == 1
    assert "L_keyed_mysql:" not in mysql.mysql_text(MYSQL)  # a run saved before it existed


def test_the_mysql_scenario_shows_each_drain_with_no_broker_beside_its_kafka_drain() -> None:
    bare = {"rows_per_second": 14_400.0, "seconds": 3.5, "mean_claim_ms": 100.0, "steps_ratio": 0.9}
    text = mysql.mysql_text({**MYSQL, "null_keys": {**MYSQL["null_keys"], "no_broker": bare}})
    assert "| null keys | 25,600 | 0.80 | 1.60 | >= 0.9 (met) | 0.90 |  | 120 ms |" in text
    assert "| 5,000 keys | 6,400 | 0.20 | 0.40 | >= 0.8 (missed) |  |  | 230 ms |" in text
    assert "*No broker*" in text


def test_the_null_sink_acknowledges_what_the_holds_admit_and_keeps_nothing() -> None:
    import asyncio
    from datetime import UTC, datetime

    from bench import null_relay
    from bench.relayproc import NULL_SINK, RelayProcess
    from relay.events import HELD, Event
    from relay.holds import KeyHolds

    def event(n: int, key: str | None, *, chained: bool = False) -> Event:
        return Event(
            id=n, topic="t", key=key, payload=b"{}", headers={}, idempotency_key=f"i{n}", attempts=0,
            created_at=datetime(2026, 12, 1, tzinfo=UTC), chained=chained,
        )  # fmt: skip

    sink = null_relay.NullSink()
    holds = KeyHolds()
    holds.hold([event(0, "k")])
    events = [event(1, "k", chained=True), event(2, "j"), event(3, None)]
    assert asyncio.run(sink.publish(events, holds.of(1))) == [HELD, None, None]
    assert sink.delivered == [] and sink.attempted == []
    assert RelayProcess("postgresql://x", f"{NULL_SINK}x").args[1:3] == ["-m", "bench.null_relay"]
    assert RelayProcess("postgresql://x", "kafka://x").args[1:3] == ["-m", "relay"]


def test_the_mysql_scenario_runs_the_keyed_floor_for_every_keyed_drain() -> None:
    assert set(mysql.KEYED_FLOORS) == {label for label, keys in mysql.DRAINS.items() if keys is not None}
