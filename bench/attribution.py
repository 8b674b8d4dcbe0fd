"""Attribute time to the relay's phases: py-spy's stacks and EXPLAIN's plans (pure functions).

A line of ``py-spy record --format raw --threads`` is
``thread (TID): NAME;frame (file:line);...;frame (file:line) COUNT``, outermost
frame first. Each sample goes to the first rule below that matches it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from relay.config import BATCH_SIZE

_METRICS_MARKERS = ("Histogram.", "Counter.", "Gauge.", "MetricWrapperBase", "MutexValue")


def _functions(frames: list[str]) -> list[str]:
    return [frame.split(" (", 1)[0] for frame in frames]


def category(thread: str, functions: list[str]) -> str:
    """The phase one sample belongs to."""
    names = set(functions)
    if "kafka-poll" in thread:
        if any("on_delivery" in f or "_Batch.record" in f for f in functions):
            return "kafka: delivery callbacks (poll thread)"
        return "kafka: librdkafka poll (poll thread)"
    if "kafka-produce" in thread:
        if "Event.message_headers" in names:
            return "kafka: building headers (produce thread)"
        if any("set_result" in f or "call_soon_threadsafe" in f for f in functions):
            return "kafka: waking the event loop (produce thread)"
        return "kafka: produce() calls (produce thread)"
    if names & {"PostgresStore.claim", "PostgresStore.start_claim", "_Leased.events", "_Leased.__init__"}:
        if "AsyncCursor.fetchall" in names:
            return "claim: row decoding (psycopg fetchall, jsonb json.loads)"
        if "PostgresStore._fetch" in names:
            return "claim: query (params, send, wait for rows)"
        return "claim: sorting + building Event objects"
    if "PostgresStore.settle" in names:
        return "settle: DELETE (params, send, wait)"
    if names & {"Deliveries.judge", "Costs.verdict"}:
        if any(f.startswith(_METRICS_MARKERS) for f in functions):
            return "metrics (prometheus_client, per event)"
        return "judging outcomes"
    if "KafkaSink.publish" in names or "RabbitMQSink.publish" in names:
        return "publish (event-loop side)"
    if names & {"PostgresStore.status", "PostgresStore.reap"}:
        return "status and reap queries"
    if functions and functions[-1].endswith("Selector.select"):
        return "event loop: select (waiting for I/O)"
    if "MainThread" in thread:
        return "event loop: asyncio and other"
    return "other threads"


def categorize_collapsed(text: str) -> tuple[dict[str, float], dict[str, float], int]:
    """Shares of samples per phase and per thread name, and the number of samples."""
    by_category: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
        by_thread[thread.rstrip("_0123456789") or thread] += count
        by_category[category(thread, _functions(frames[1:]))] += count
    total = sum(by_category.values())
    if not total:
        return {}, {}, 0
    return (
        {name: n / total for name, n in by_category.most_common()},
        {name: n / total for name, n in by_thread.most_common()},
        total,
    )


def subplan_times(plan: dict[str, Any]) -> dict[str, float]:
    """Milliseconds in each named sub-plan (CTE, SubPlan, InitPlan) of an EXPLAIN (ANALYZE, FORMAT JSON) plan.

    Also ``total`` and ``outside CTEs`` (the total less the time of the
    CTEs the root reads). A sub-plan that runs in a loop counts every loop.
    """
    times: dict[str, float] = {}

    def walk(node: dict[str, Any]) -> None:
        name = node.get("Subplan Name")
        if name:
            times[name] = times.get(name, 0.0) + node["Actual Total Time"] * node.get("Actual Loops", 1)
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan)
    total = float(plan["Actual Total Time"])
    ctes = sum(ms for name, ms in times.items() if name.startswith("CTE "))
    return {"total": total, **times, "outside CTEs": total - ctes}


def findings(result: dict[str, Any]) -> list[str]:
    """Plain sentences derived from the figures, for the report and the doc."""
    notes = []
    explain = result.get("explain", {})
    claim = explain.get("claim UPDATE (1,000 rows)")
    drain = explain.get("L_db DELETE ... RETURNING (1,000 rows)")
    settle = explain.get("settle DELETE (ack_delete, 1,000 ids)")
    if claim and drain:
        parts = claim["parts_ms"]
        check = sum(ms for name, ms in parts.items() if name.startswith("SubPlan"))
        notes.append(
            f"Server side, one claim of 1,000 takes {claim['execution_ms']:.1f} ms, "
            f"{claim['execution_ms'] / drain['execution_ms']:.1f}x L_db's whole DELETE ... RETURNING "
            f"({drain['execution_ms']:.1f} ms); its per-key NOT EXISTS check is {check:.1f} ms of it and the "
            f"UPDATE ... RETURNING outside the candidates CTE {parts.get('outside CTEs', 0):.1f} ms."
        )
    phases = result.get("phases", {}).get("by_phase", {})
    query_wall = phases.get("claim: query (server + wire)")
    if query_wall and claim:
        notes.append(
            f"From the relay's side a claim's query takes {query_wall['per_batch_ms']:.1f} ms per batch until "
            f"its rows are in, against {claim['execution_ms']:.1f} ms of execution on a fresh table: the rest "
            "is the commit's WAL flush, moving the rows, dead rows the drain leaves behind, and waiting "
            "(for the connection, or for an event loop busy with other batches)."
        )
    settle_wall = phases.get("settle (whole call)")
    if settle_wall and settle:
        notes.append(
            f"A settle takes {settle_wall['per_batch_ms']:.1f} ms per batch from the relay's side against "
            f"{settle['execution_ms']:.1f} ms of execution on the server (the rest: round trip, WAL flush, waiting)."
        )
    claim_wall = phases.get("claim (whole call)")
    if claim_wall:
        batch = result.get("phases", {}).get("batch_size", BATCH_SIZE)
        notes.append(
            f"The loop awaits one claim at a time, and claims took {claim_wall['share']:.0%} of the drain's "
            f"wall time: at {claim_wall['per_batch_ms']:.1f} ms per claim of {batch:,} the loop cannot pass "
            f"{batch / claim_wall['per_batch_ms'] * 1000:,.0f} events/s, whatever the broker does."
        )
    cpu = result.get("cpu")
    if cpu:
        busy = ", ".join(f"{name} {share:.0%}" for name, share in cpu["busy_by_thread"].items())
        notes.append(f"Share of the drain each relay thread was on a CPU (py-spy): {busy}.")
    return notes
