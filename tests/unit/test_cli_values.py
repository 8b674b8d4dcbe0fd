"""Values of duration flags and switch variables: refused clearly, never read as something else."""

from __future__ import annotations

import argparse

import pytest

from relay.cli.flags import MAX_SECONDS, seconds, switched_on


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "NaN", "1e400", "infinity", "1e20", "3.2e9", "-1", "x", ""])
def test_a_duration_that_is_not_a_finite_sane_number_of_seconds_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        seconds(text)


@pytest.mark.parametrize("text", ["0", "0.5", "30", "86400", "3e9", str(MAX_SECONDS)])
def test_durations_up_to_a_hundred_years_are_taken(text: str) -> None:
    assert seconds(text) == float(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("TRUE", True),
        (" yes ", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
        ("", None),
        ("  ", None),
    ],
)
def test_switch_values(text: str, value: bool | None) -> None:
    assert switched_on(text) is value


@pytest.mark.parametrize("text", ["ture", "abc", "2", "enabled", "y", "-1", "off!"])
def test_a_switch_value_that_is_neither_on_nor_off_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a switch"):
        switched_on(text)
