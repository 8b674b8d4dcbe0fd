"""docs/performance.md's figures, rendered from one run's results (and the last profile, if any).

The page itself holds the prose. What a run measures sits between markers,
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``, on lines of their own
around a block or inline within a sentence; :func:`fill` rewrites what lies
between them and leaves every other character of the page as it is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench import report
from bench.baselines import RABBIT_WINDOW
from bench.keys_report import keys_section
from bench.latency import latency_text
from bench.mysql import mysql_text
from bench.writers import publish_cost_text
from relay.config import BATCH_SIZE, PIPELINE_DEPTH
from relay.sinks.kafka import LINGER_MS

PAGE_PATH = Path(__file__).parent.parent / "docs" / "performance.md"
PROFILE_PATH = Path(__file__).parent / "results" / "profile.json"
GAUGES_PATH = Path(__file__).parent / "results" / "gauges.json"

_SECTION = re.compile(
    r"(?P<open><!-- bench:(?P<name>[\w-]+) -->)(?P<body>.*?)(?P<close><!-- /bench:(?P=name) -->)", re.S
)


def fill(page: str, texts: Mapping[str, str]) -> str:
    """``page`` with the marked section of each name in ``texts`` holding that text.

    A section whose opening marker ends its line is a block: its text stands
    on lines of its own, a blank line either side. Any other is inline.
    Raises ``ValueError`` for a name the page has no section for.
    """
    missing = set(texts) - {match["name"] for match in _SECTION.finditer(page)}
    if missing:
        raise ValueError(f"the page has no section {', '.join(sorted(missing))}: mark it <!-- bench:NAME -->")

    def replace(match: re.Match[str]) -> str:
        text = texts.get(match["name"])
        if text is None:
            return match[0]
        if match["body"].startswith("\n"):
            text = f"\n\n{text}\n\n"
        return f"{match['open']}{text}{match['close']}"

    return _SECTION.sub(replace, page)


def render(results: dict[str, Any], page: str) -> str:
    """``page`` (docs/performance.md) with every marked section filled from ``results``."""
    return fill(page, sections(results))


def sections(results: dict[str, Any]) -> dict[str, str]:
    """The text of each marked section of the page, by name, for ``results``."""
    return {
        "run": _run_text(results),
        "targets": _targets_text(results),
        "figures": _figures_text(results),
        "rabbit-window": f"{RABBIT_WINDOW:,}",
        "pipeline-depth": f"{PIPELINE_DEPTH}",
        "batch-size": f"{BATCH_SIZE:,}",
        "linger-ms": f"{LINGER_MS}",
        "profile": "\n".join(_profile_section(results)),
        "gauges": _gauges_section(results),
        "keys": keys_section(results),
        "relay-latency": latency_text(results.get("relay_latency")),
        "publish-cost": publish_cost_text(results),
        "mysql": mysql_text(results.get("mysql")),
    }


def _fmt_setting(settings: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(settings.items()))


def _run_text(results: dict[str, Any]) -> str:
    m = results.get("machine", {})
    config = results.get("config", {})
    return "\n".join(
        [
            f"- Date: {m.get('date', '?')}; relay source: {m.get('source', '?')}",
            f"- Machine: {m.get('nproc', '?')} cores ({m.get('cpu', '?')}), {m.get('memory_gb', '?')} GB memory, "
            f"Linux {m.get('kernel', '?')}, Python {m.get('python', '?')}; shared with other work while measuring",
            f"- PostgreSQL {m.get('postgresql', '?')} ({_fmt_setting(m.get('postgresql_settings', {}))}), "
            f"RabbitMQ {m.get('rabbitmq', '?')}, Tansu (in-memory Kafka protocol broker)",
            f"- Run: `{config.get('command', 'python -m bench')}`, {config.get('events', 0):,} events per drain, "
            f"S2 {config.get('s2_seconds', 0):.0f} s per mode, S4 {config.get('s4_seconds', 0):.0f} s",
        ]
    )


def _targets_text(results: dict[str, Any]) -> str:
    lines = ["| Target | This run | Met |", "| --- | --- | --- |"]
    for verdict in report.evaluate(results):
        met = {True: "yes", False: "**no**", None: "not run"}[verdict["met"]]
        lines.append(f"| {verdict['target']} | {verdict['shown']} | {met} |")
    l_kafka = report.dig(results, "baselines.l_kafka.rate")
    if l_kafka:
        lines += [
            "",
            f"The 30,000 events/s target is absolute; the raw client against Tansu (L_kafka) reached "
            f"{l_kafka:,.0f}/s in this run, so the ratios are the figures to compare between runs.",
        ]
    return "\n".join(lines)


def _figures_text(results: dict[str, Any]) -> str:
    lines = ["| Figure | Value | Against the baseline |", "| --- | --: | --- |"]
    lines += [f"| {name} | {value} | {note} |" for name, value, note in report.rows(results)]
    rate = results.get("s2_rate")
    if rate:
        lines += [
            "",
            f"S2 and S4 offered {rate['rate']:,.0f} events/s ({rate['why']}; half the S1 Kafka rate would be "
            f"{(rate.get('s1_rate') or 0) / 2:,.0f}/s, and the writers reach {rate['writer_capacity']:,.0f} "
            "business transactions/s flat out on this machine).",
        ]
    if results.get("errors"):
        lines += ["", "Scenarios that failed in this run: " + ", ".join(sorted(results["errors"])) + "."]
    return "\n".join(lines)


def _profile_section(results: dict[str, Any]) -> list[str]:
    data = results.get("profile")
    if data is None and PROFILE_PATH.exists():
        try:
            data = json.loads(PROFILE_PATH.read_text())
        except ValueError:
            data = None
    if not data:
        return ["Not profiled yet: run `python -m bench --only profile`."]
    return [profile_text(data)]


def _pct(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) and not math.isnan(value) else "-"


def profile_text(data: dict[str, Any]) -> str:
    """The profile's findings as Markdown."""
    lines = [f"Profiled {data.get('date', '?')} with {data.get('events', 0):,} events."]
    wall = data.get("phases")
    if wall:
        lines += [
            "",
            f"Wall time of the in-process relay's phases ({wall['rate']:,.0f} events/s, "
            f"{wall['batches']} batches, {wall['seconds']:.1f} s; phases overlap, pipeline depth "
            f"{wall.get('pipeline_depth', '?')}):",
            "",
            "| Phase | Total | Per batch | Share of the drain's wall time |",
            "| --- | --: | --: | --: |",
        ]
        for name, phase in wall["by_phase"].items():
            lines.append(
                f"| {name} | {phase['seconds']:.2f} s | {phase['per_batch_ms']:.1f} ms | {_pct(phase['share'])} |"
            )
    cpu = data.get("cpu")
    if cpu:
        lines += [
            "",
            f"CPU samples of an `outbox-relay run` process between 10% and 90% of the drain "
            f"({cpu['tool']}, {cpu['samples']:,} samples, all threads, idle waits left out; "
            f"{cpu.get('rate', math.nan):,.0f} events/s while sampled):",
            "",
            "| Where | Share of CPU samples |",
            "| --- | --: |",
        ]
        lines += [f"| {name} | {_pct(share)} |" for name, share in cpu["by_category"].items()]
    explain = data.get("explain")
    if explain:
        lines += [
            "",
            "Server-side execution time (EXPLAIN ANALYZE on a fresh copy of the seeded table, 1,000 rows):",
            "",
            "| Statement | Execution | Planning | Parts |",
            "| --- | --: | --: | --- |",
        ]
        for name, row in explain.items():
            parts = ", ".join(f"{part} {ms:.1f} ms" for part, ms in row.get("parts_ms", {}).items() if part != "total")
            lines.append(f"| {name} | {row['execution_ms']:.1f} ms | {row['planning_ms']:.1f} ms | {parts} |")
    notes = data.get("notes")
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines)


def _gauges_section(results: dict[str, Any]) -> str:
    data = results.get("gauges")
    if (data is None or "gauges" in results.get("errors", {})) and GAUGES_PATH.exists():
        try:
            data = json.loads(GAUGES_PATH.read_text())
        except ValueError:
            data = None
    if not data:
        return "Not measured yet: run `python -m bench --only gauges`."
    return gauges_text(data)


def _counts(status: dict[str, Any]) -> str:
    return " / ".join(f"{status[k]:,}" for k in ("pending", "in_flight", "failed", "parked_keys"))


def gauges_text(data: dict[str, Any]) -> str:
    """The gauges measurement as Markdown: cost by table size, the plans, and how close the estimate is."""
    cases = data.get("cases", [])
    lines = [
        f"Measured {data.get('date', '?')} at {data.get('source', '?')}. Each table is a throwaway database "
        "holding S1's seed rows (keyed, ~200 bytes of JSON, the migrated table), built with one INSERT ... "
        "SELECT generate_series and VACUUM ANALYZE, autovacuum off. Each time is the median of "
        f"{data.get('repeats', '?')} calls of the relay's own `PostgresStore` method after a warm-up call, "
        "from Python, round trips included. `python -m bench --only gauges` measures again (`--long` adds "
        "3,000,000 events) and rewrites this section alone.",
        "",
        "| Table | Heap + indexes | `status()`: exact, the `status` command | "
        "`gauges()`: the relay's counts, every 30 s | `oldest_pending_age()`: every 5 s |",
        "| --- | --: | --: | --: | --: |",
    ]
    for case in cases:
        calls, seed = case["calls"], case["seed"]
        lines.append(
            f"| {case['name']} | {seed['table_mb']:,.0f} + {seed['indexes_mb']:,.0f} MB "
            f"| {calls['status']['median_ms']:,.1f} ms | {calls['gauges']['median_ms']:,.1f} ms "
            f"| {calls['oldest_pending_age']['median_ms']:.2f} ms |"
        )
    budget = data.get("budget_ms", 50.0)
    bound = data.get("exact_up_to", 0) + 1
    worst = max((c["calls"]["gauges"]["median_ms"] for c in cases), default=math.nan)
    growth = ", ".join(f"{c['calls']['status']['median_ms']:,.0f} ms on {c['name']}" for c in cases if not c["mixed"])
    if cases:
        lines += [
            "",
            f"`status()` reads every unsent row: {growth}. The relays refreshed their count gauges with it "
            f"every 30 s until `gauges()` took its place there, which reads at most {bound:,} unsent events "
            f"whatever the table holds: at most {worst:,.1f} ms on these tables, "
            f"{'within' if worst <= budget else '**over**'} the budget of {budget:.0f} ms.",
        ]
    lines += [
        "",
        "Server side, EXPLAIN (ANALYZE, BUFFERS) of each query, run once before:",
        "",
        "| Table | Query | Execution | Buffers hit / read | What it reads of the outbox |",
        "| --- | --- | --: | --: | --- |",
    ]
    for case in cases:
        for i, (query, plan) in enumerate(case["explain"].items()):
            workers = f" ({plan['workers']} parallel workers)" if plan["workers"] else ""
            lines.append(
                f"| {case['name'] if i == 0 else ''} | {query} | {plan['execution_ms']:,.1f} ms "
                f"| {plan['shared_hit']:,} / {plan['shared_read']:,} | {'; '.join(plan['scans'])}{workers} |"
            )
    lines += [
        "",
        f"What the gauges report (pending / in flight / failed / parked keys). Up to "
        f"{data.get('exact_up_to', 0):,} unsent events they are exact; past that pending is an estimate "
        "and in flight counts the leases among the first events in claim order (see "
        "[Operations](operations.md#the-gauges-and-what-they-cost)):",
        "",
        "| Table | `status` (exact) | gauges |",
        "| --- | --: | --: |",
    ]
    for case in cases:
        lines.append(
            f"| {case['name']} | {_counts(case['calls']['status']['value'])} "
            f"| {_counts(case['calls']['gauges']['value'])} |"
        )
        for step in case.get("churn", []):
            lines.append(f"| {case['name']}, {step['step']} | {_counts(step['status'])} | {_counts(step['gauges'])} |")
    for case in cases:
        if case["mixed"]:
            in_flight = case["calls"]["status"]["value"]["in_flight"]
            lines += [
                "",
                f"{in_flight:,} events in flight at once would take some "
                f"{in_flight / (BATCH_SIZE * PIPELINE_DEPTH):,.0f} relays at the default batch size and pipeline "
                f"depth. Spread evenly through the table, most of those leases lie past the first {bound:,} "
                "events in claim order, so the gauges count them as pending. Rows marked sent but kept "
                "(`--keep-sent`) count as unsent until the table is next analysed.",
            ]
    built = [c for c in cases if c.get("index_build_seconds") is not None]
    if built:
        lines += [
            "",
            f"Migration 0003 (the dead-letter index) took {built[0]['index_build_seconds']:.1f} s on the "
            f"{built[0]['name']} table, blocking inserts meanwhile.",
        ]
    return "\n".join(lines)
