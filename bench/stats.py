"""Pure arithmetic of the benchmark: percentiles, windowed rates, /proc and /metrics parsing.

Nothing here does I/O, so the smoke test can run all of it in milliseconds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

#: A receive log: ``(monotonic seconds, messages received so far)``, in time order.
Marks = Sequence[tuple[float, int]]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated.

    ``values`` must be sorted. An empty sequence has no percentile: NaN.
    """
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    rank = (len(values) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def latency_summary(latencies_seconds: Iterable[float]) -> dict[str, float]:
    """p50, p99, p99.9 and max in milliseconds, plus the count."""
    ordered = sorted(latencies_seconds)
    return {
        "n": len(ordered),
        "p50_ms": percentile(ordered, 50) * 1000,
        "p99_ms": percentile(ordered, 99) * 1000,
        "p999_ms": percentile(ordered, 99.9) * 1000,
        "max_ms": (ordered[-1] * 1000) if ordered else math.nan,
    }


def crossing(marks: Marks, count: float) -> tuple[float, int] | None:
    """The first mark at which at least ``count`` messages had been received."""
    counts = [c for _, c in marks]
    index = bisect.bisect_left(counts, count)
    return marks[index] if index < len(marks) else None


def window_rate(marks: Marks, total: int, low: float, high: float) -> float:
    """Messages per second between the ``low`` and ``high`` fractions of ``total`` received.

    The window's ends are the first marks at or past each fraction, and the
    rate counts the messages actually received between those two marks, so a
    receive log with one mark per fetched batch is exact enough.
    """
    if not 0 <= low < high <= 1:
        raise ValueError(f"window {low}..{high} is not within 0..1")
    start = crossing(marks, low * total)
    end = crossing(marks, high * total)
    if start is None or end is None or end[0] <= start[0]:
        return math.nan
    return (end[1] - start[1]) / (end[0] - start[0])


def received_before(marks: Marks, when: float) -> int:
    """How many messages had been received at the last mark at or before ``when`` (0 if none)."""
    index = bisect.bisect_right([at for at, _ in marks], when)
    return marks[index - 1][1] if index else 0


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when either is missing, NaN or the denominator is 0."""
    if numerator is None or denominator is None:
        return None
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return None
    return numerator / denominator


def proc_cpu_seconds(stat_text: str, clock_ticks: int) -> float:
    """utime + stime of a process, from the text of ``/proc/PID/stat``.

    The command name (field 2) may contain spaces and parentheses, so fields
    are counted from the last ``)``: utime and stime are fields 14 and 15.
    """
    fields = stat_text[stat_text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state), so field N is fields[N - 3].
    return (int(fields[11]) + int(fields[12])) / clock_ticks


def proc_status_bytes(status_text: str, field: str) -> int:
    """A ``kB`` field of ``/proc/PID/status`` (``VmHWM``, ``VmRSS``) in bytes; 0 if absent."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0]) * 1024
    return 0


def histogram_sum_count(metrics_text: str, name: str) -> tuple[float, float]:
    """``(sum, count)`` of an unlabelled Prometheus histogram in text exposition."""
    total = count = math.nan
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_sum "):
            total = float(line.split()[1])
        elif line.startswith(f"{name}_count "):
            count = float(line.split()[1])
    return total, count


def mean_between(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Mean observation between two ``(sum, count)`` readings of one histogram."""
    observations = after[1] - before[1]
    if not observations or math.isnan(observations):
        return math.nan
    return (after[0] - before[0]) / observations


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when empty)."""
    return percentile(sorted(values), 50)


def histogram_buckets(metrics_text: str, name: str) -> list[tuple[float, float]]:
    """``(upper bound, cumulative count)`` of an unlabelled Prometheus histogram, in bound order."""
    buckets = []
    prefix = f'{name}_bucket{{le="'
    for line in metrics_text.splitlines():
        if line.startswith(prefix):
            bound = line[len(prefix) : line.index('"', len(prefix))]
            buckets.append((math.inf if bound == "+Inf" else float(bound), float(line.split()[-1])))
    return sorted(buckets)


def bucket_delta(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The observations between two readings of the same histogram."""
    earlier = dict(before)
    return [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile``: linear within the bucket holding the ``q`` (0..1) quantile."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # past the last finite bucket: its bound is all we know
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return math.nan
