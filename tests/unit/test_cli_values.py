"""Values of duration flags and switch variables: refused clearly, never read as something else."""

from __future__ import annotations

import argparse

import pytest

from relay.cli.flags import MAX_INT, MAX_SECONDS, MIN_INT, event_id, positive_int, seconds, switched_on
from relay.config import parse_duration
from relay.errors import ConfigError


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


@pytest.mark.parametrize("text", ["0", "-1", "1.5", str(MAX_INT + 1), "99999999999999999999", "1e3"])
def test_a_whole_number_out_of_bigint_or_below_one_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        positive_int(text)


def test_whole_numbers_up_to_bigint_are_taken() -> None:
    assert positive_int(str(MAX_INT)) == MAX_INT


@pytest.mark.parametrize("text", ["99999999999d", "5300w", "3200000000"])
def test_a_duration_over_a_hundred_years_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="more than a hundred years"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["\u0667d", "\uff17d", "7\u0660s", "1_0d", "7 d 3", "7dd", "-1d", "+1d", ".5h", "1.h"])
def test_a_duration_not_in_ascii_digits_and_one_unit_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid duration"):
        parse_duration(text)


def test_a_hundred_years_of_weeks_is_taken() -> None:
    assert parse_duration("5200w") == 5200 * 7 * 86400


@pytest.mark.parametrize("text", ["1", "0", "-0", "-5", "42", str(MAX_INT), str(MIN_INT), "007"])
def test_every_bigint_is_an_event_id(text: str) -> None:
    # Plain SQL may write ids of 0 and below (operations.md): dead lists them, so the commands take them.
    assert event_id(text) == int(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 5",
        "5 ",
        "+5",
        "1_000",
        "\u0667",
        "\uff15",
        "1e3",
        "0x10",
        "5.0",
        "--5",
        "-",
        str(MAX_INT + 1),
        str(MIN_INT - 1),
    ],
)
def test_an_event_id_that_is_no_bigint_in_ascii_digits_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="event id"):
        event_id(text)
