"""The key-distribution figures as verdicts and Markdown: pure functions of ``results["keys"]``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from bench.keys import (
    BEFORE,
    KAFKA_CASES,
    KEYS_PATH,
    LATE_OVER_EARLY,
    RABBIT_CASES,
    SERIAL_EVENTS,
    SINK_LABELS,
    SPREADS,
    TARGETS,
)
from bench.stats import ratio

_BASELINE_LABELS = {"l_db": "L_db", "l_rmq": "L_rmq", "l_rmq_serial": "L_rmq,1", "l_db_big": "L_db,16K"}


def _measured(value: Any) -> bool:
    return isinstance(value, int | float) and not math.isnan(value)


def verdicts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case run: its rate, its ratios to L_db and L_rmq, its targets and whether they were met.

    ``met`` and ``late_met`` are None where there is no target or no figure.
    """
    rates = {name: entry.get("rate") for name, entry in data.get("baselines", {}).items()}
    rows = []
    order = [("kafka", name) for name in KAFKA_CASES] + [("rabbitmq", name) for name in RABBIT_CASES]
    for sink, spread in order:
        case = data.get("cases", {}).get(f"{sink}/{spread}")
        if case is None:
            continue
        rate = case.get("rate")
        over = {name: ratio(rate, rates.get(name)) for name in _BASELINE_LABELS}
        # A backlog of other payloads is measured against L_db on a copy of itself, in the L_db column.
        own = SPREADS[spread].baseline
        over["l_db"] = over[own]
        target = TARGETS.get((sink, spread))
        before = BEFORE.get((sink, spread))
        wanted, basis = target or before or (None, None)
        found = over[basis] if basis is not None else None
        met = found >= wanted if found is not None and wanted is not None else None
        target_text = "-"
        if wanted is not None and basis is not None:
            target_text = f">= {wanted:g} x {_BASELINE_LABELS[basis]}" + ("" if target else " (before issue 16)")
        late = case.get("s3_ratio")
        rows.append(
            {
                "case": f"{SINK_LABELS[sink]}, {SPREADS[spread].label}",
                "rate": rate,
                "cut": bool(case.get("cut")),
                "received": case.get("received"),
                "over_l_db": over["l_db"],
                "over_l_rmq": over["l_rmq"],
                # One unconfirmed message at a time is what keeps a key's order on RabbitMQ.
                "over_l_rmq_serial": over["l_rmq_serial"] if sink == "rabbitmq" else None,
                "target": target_text,
                "met": met,
                "late_over_early": late,
                "late_met": late >= LATE_OVER_EARLY if _measured(late) else None,
            }
        )
    return rows


def _ratio(value: float | None) -> str:
    """Three significant digits from 0.01 up; two below, without an exponent (0.000037)."""
    if value is None:
        return "-"
    if value >= 0.01 or value <= 0:
        return f"{value:.3g}"
    return f"{value:.{1 - math.floor(math.log10(value))}f}"


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "-"}[met]


def _rate(row: dict[str, Any], data: dict[str, Any]) -> str:
    rate = row["rate"]
    text = (f"{rate:,.0f}/s" if rate >= 100 else f"{rate:.1f}/s") if _measured(rate) else "-"
    if row["cut"]:
        text += f" (cut at {data.get('cap_seconds', 0):.0f} s, {row['received'] or 0:,} received)"
    return text


def _load(data: dict[str, Any]) -> str:
    load = data.get("load_average", {})
    if "start" not in load or "end" not in load:
        return ""
    return f" The load average was {load['start']:.1f} at the start and {load['end']:.1f} at the end."


def _share(data: dict[str, Any], name: str, over: str, end: str = "") -> str | None:
    """The text ``, 0.2 x L_rmq`` (then ``end``) for baseline ``name`` over baseline ``over``; empty
    without a rate of ``over``; None if ``name`` was not measured."""
    rates = {key: entry.get("rate") for key, entry in data.get("baselines", {}).items()}
    if not _measured(rates.get(name)):
        return None
    found = ratio(rates[name], rates.get(over))
    return f", {_ratio(found)} x {_BASELINE_LABELS[over]}{end}" if found is not None else ""


def _serial(data: dict[str, Any], baseline: Callable[[str], str]) -> str:
    """What L_rmq,1 is, and what it says about the RabbitMQ targets, when it was measured."""
    share = _share(data, "l_rmq_serial", "l_rmq")
    if share is None:
        return ""
    return (
        f" L_rmq,1 {baseline('l_rmq_serial')}{share} is the same client with one unconfirmed message at a time "
        f"(the same payloads, at most {SERIAL_EVENTS:,}): the most any publisher gets from one key while a "
        "message that is nacked or returned is never overtaken by a later one of its key, which is how the relay "
        "keeps a key's order on RabbitMQ."
    )


def _lease(data: dict[str, Any], baseline: Callable[[str], str]) -> str:
    """What L_lease is, and what it says about the x L_db targets, when it was measured."""
    share = _share(data, "l_lease", "l_db", ",")
    if share is None:
        return ""
    text = (
        f" L_lease {baseline('l_lease')}{share} is the bare loop of a relay that leases each row "
        "(bench/lease_loop.py: the lease UPDATE ... RETURNING on one connection, the DELETE by token on another, "
        "overlapping; no ordering, no broker, no events built) on a copy of the 1,000-key backlog: the database "
        "work of such a relay, and nothing else."
    )
    share = _share(data, "l_lease_kafka", "l_db", ",")
    if share is not None:
        text += (
            f" L_lease,kafka {baseline('l_lease_kafka')}{share} is that loop producing each batch to Kafka with "
            "the relay's producer settings and deleting it once all of it is acknowledged: what a relay written "
            "in Python that leases each row gets here before any ordering, holds, outcomes or metrics; a Kafka "
            "row's x L_db below it is the relay's own cost."
        )
    return text


def _big(data: dict[str, Any], baseline: Callable[[str], str]) -> str:
    """What the 16 KB case drains, and its own L_db, when it was measured."""
    if "kafka/big" not in data.get("cases", {}):
        return ""
    big = SPREADS["big"]
    return (
        f" The {big.label} case drains {big.events(data.get('events', 0)):,} events whose payloads carry "
        f"{big.blob_bytes:,} more bytes of random base64 text (which PostgreSQL cannot compress), and its x L_db "
        f"is over L_db,16K {baseline('l_db_big')}, the same loop on a copy of that backlog."
    )


def keys_text(data: dict[str, Any]) -> str:
    """The key-distribution section of docs/performance.md."""
    base = data.get("baselines", {})

    def baseline(name: str) -> str:
        rate = base.get(name, {}).get("rate")
        runs = len(base.get(name, {}).get("runs", []))
        return f"{rate:,.0f}/s (mean of {runs} runs)" if _measured(rate) else "not measured"

    lines = [
        f"Measured {data.get('date', '?')} at {data.get('source', '?')}. Each case drains "
        f"{data.get('events', 0):,} events written with COPY (~{data.get('payload_bytes', 0)} bytes of JSON "
        f"each; keys take turns through the backlog) with one `outbox-relay run` at default settings (three, "
        "started together, in the cases that say so), to Tansu "
        f"with {data.get('partitions', 0)} partitions or to a durable RabbitMQ queue. A case still draining "
        f"after {data.get('cap_seconds', 0):.0f} s is cut, and its rates are then those of what arrived by then "
        f"(between 10% and 90% of it). L_db {baseline('l_db')} and L_rmq {baseline('l_rmq')} (the same "
        "payloads) were taken before and after the cases."
        + _big(data, baseline)
        + _load(data)
        + _serial(data, baseline)
        + _lease(data, baseline),
        "",
        "| Case | Drain rate | x L_db | x L_rmq | x L_rmq,1 | Target | Met "
        "| Rate at 80-90% / 10-20% received | >= 0.9 |",
        "| --- | --: | --: | --: | --: | --- | --- | --: | --- |",
    ]
    for row in verdicts(data):
        late = row["late_over_early"]
        ratios = " | ".join(_ratio(row[name]) for name in ("over_l_db", "over_l_rmq", "over_l_rmq_serial"))
        lines.append(
            f"| {row['case']} | {_rate(row, data)} | {ratios} | {row['target']} | {_met(row['met'])} "
            f"| {f'{late:.2f}' if _measured(late) else '-'} | {_met(row['late_met'])} |"
        )
    return "\n".join(lines)


def keys_section(results: dict[str, Any]) -> str:
    """The section's text: this run's figures, or else the last saved ones."""
    data = results.get("keys")
    if (data is None or "keys" in results.get("errors", {})) and KEYS_PATH.exists():
        try:
            data = json.loads(KEYS_PATH.read_text())
        except ValueError:
            data = None
    if not data:
        return "Not measured yet: run `python -m bench --only keys`."
    return keys_text(data)
