"""bench.log_source's verdict on issue 38's targets against L_log_kafka, what one Python process does here."""

from __future__ import annotations

import pytest

from bench.log_source import _floor_verdict

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
