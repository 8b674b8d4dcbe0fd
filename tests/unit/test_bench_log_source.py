"""bench.log_source's verdict on issue 38's targets against L_log_kafka, what one Python process does here."""

from __future__ import annotations

import pytest

from bench.log_source import _drain_verdict, _floor_verdict, _rounds_summary

LDB = {"rate": 60_000.0}
TABLES = [{"cpu_per_1000": 0.020}, {"cpu_per_1000": 0.016}]


def test_a_floor_within_both_targets_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    _floor_verdict({"rate": 120_000.0, "cpu_per_1000": 0.006}, LDB, TABLES)
    assert capsys.readouterr().out == ""


def test_a_floor_under_the_drain_target_says_the_target_is_beyond_a_python_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _floor_verdict({"rate": 80_000.0, "cpu_per_1000": 0.006}, LDB, TABLES)
    out = capsys.readouterr().out
    assert "L_log_kafka is 1.33 x L_db, under the 1.5 x target" in out
    assert "CPU" not in out


def test_a_floor_over_the_cpu_share_names_the_spreads_it_is_over_in(capsys: pytest.CaptureFixture[str]) -> None:
    _floor_verdict({"rate": 120_000.0, "cpu_per_1000": 0.009}, LDB, TABLES)
    out = capsys.readouterr().out
    assert "0.45-0.56 x the table source's, over the 0.5 x target in 1 of 2 spreads" in out
    assert "under the 1.5 x target" not in out


def _pair(log_rate: float, table_rate: float) -> dict[str, dict[str, float]]:
    return {"log": {"rate": log_rate, "cpu_per_1000": 0.010}, "table": {"rate": table_rate, "cpu_per_1000": 0.012}}


def test_a_spreads_rounds_give_the_median_of_each_source_and_the_median_and_range_of_their_ratios() -> None:
    summary = _rounds_summary([_pair(60_000, 20_000), _pair(40_000, 25_000), _pair(90_000, 30_000)])

    assert summary["log"] == {"rate": 60_000, "cpu_per_1000": 0.010}
    assert summary["table"]["rate"] == 25_000
    # The rounds' own ratios (3.0, 1.6, 3.0), not the ratio of the medians (2.4).
    assert summary["log_over_table"] == {"median": 3.0, "min": 1.6, "max": 3.0}
    assert len(summary["rounds"]) == 3


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        ((2.1, 2.5, 3.0), "met (every round >= 2 x)"),
        ((1.6, 2.2, 3.0), "met by the median (the least round 1.60 x)"),
        ((1.6, 1.9, 2.4), "not met by the median (the best round 2.40 x)"),
        ((1.6, 1.7, 1.9), "not met (no round >= 2 x)"),
    ],
)
def test_the_drain_verdict_goes_by_the_median_of_the_rounds_and_says_how_they_spread(
    ratios: tuple[float, float, float], verdict: str
) -> None:
    low, median, high = ratios
    assert _drain_verdict({"median": median, "min": low, "max": high}) == verdict
