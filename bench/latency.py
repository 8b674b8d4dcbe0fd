"""The relay's own latency (issue 16): S2's commit-to-consume minus the raw client's produce-to-consume.

Both legs run at the same rate (~500 events/s) with the same kind of
consumer (S2's): the raw confluent-kafka producer with the relay's settings
(:meth:`bench.runner.Run.raw_latency`, as L_latency) before and after one S2
run with NOTIFY on (:func:`bench.steady.run_steady`). The raw figure is the
mean of the two raw runs' percentiles; the difference is what the relay adds
between a COMMIT and a consumer seeing the event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench.steady import Steady, run_steady

if TYPE_CHECKING:
    from bench.runner import Run

RATE = 500.0
SECONDS = 20.0
#: Issue 16's targets for the difference, in milliseconds.
TARGET_P50_MS = 3.0
TARGET_P99_MS = 15.0
QUANTILES = ("p50_ms", "p99_ms")


def difference(data: dict[str, Any]) -> dict[str, float]:
    """Relay commit-to-consume minus the raw runs' mean produce-to-consume, per quantile (ms)."""
    raw = [run["to_consume"] for run in data["raw"]]
    relay = data["relay"]["latency"]
    return {q: relay[q] - sum(run[q] for run in raw) / len(raw) for q in QUANTILES}


def measure(run: Run, *, rate: float = RATE, seconds: float = SECONDS) -> None:
    """Raw, relay, raw at ``rate`` for ``seconds`` each, into ``run.results["relay_latency"]``."""
    data: dict[str, Any] = {"rate": rate, "seconds": seconds, "raw": []}
    run.results["relay_latency"] = data
    data["raw"].append(run.raw_latency(rate, seconds))
    steady = Steady(run.cleanup, run.template("empty"), run.bootstrap, rate, run.progress)
    data["relay"] = run_steady(steady, "latency", seconds, notify=True)
    data["raw"].append(run.raw_latency(rate, seconds))
    data["difference"] = found = difference(data)
    run.progress(
        f"relay latency at {rate:,.0f}/s: +{found['p50_ms']:.1f} ms p50, +{found['p99_ms']:.1f} ms p99 "
        "over the raw client"
    )


def latency_text(data: dict[str, Any] | None) -> str:
    """The relay-latency section of docs/performance.md."""
    if not data or "difference" not in data:
        return "Not measured in this run: `python -m bench --only latency`."
    raw = data["raw"]
    relay = data["relay"]["latency"]
    found = data["difference"]
    raw_cells = {q: " and ".join(f"{run['to_consume'][q]:.1f}" for run in raw) for q in QUANTILES}
    targets = {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS}
    writers = data["relay"]
    lines = [
        f"At {data['rate']:,.0f} events/s for {data['seconds']:.0f} s each: the raw client before and after "
        f"the relay, the same consumer. The relay's writers committed {writers['achieved_rate']:,.0f} events/s "
        f"({writers['max_behind_schedule_ms']:,.0f} ms behind schedule at worst).",
        "",
        "| Quantile | Relay: commit to consumed | Raw client: produce to consumed | Difference | Target | Met |",
        "| --- | --: | --: | --: | --: | --- |",
    ]
    for q in QUANTILES:
        met = "yes" if found[q] <= targets[q] else "**no**"
        lines.append(
            f"| {q.removesuffix('_ms')} | {relay[q]:.1f} ms | {raw_cells[q]} ms | {found[q]:+.1f} ms "
            f"| <= {targets[q]:g} ms | {met} |"
        )
    return "\n".join(lines)
