"""Every number a command takes, from its flag or its variable, is written in ASCII digits.

``int()`` and ``float()`` read any script's digits and Python's underscores: a ten in
Arabic-Indic digits ran ``--batch-size 10``, and ``RELAY_LIMIT=1_000`` listed 1000, where event
ids, durations and URL ports refuse them. No server is reached: ``serve`` is stubbed and the database is a closed port.
"""

from __future__ import annotations

from typing import Any

import pytest

from relay import cli
from tests.unit.cli_support import refused

DATABASE = "postgresql://app@127.0.0.1:1/shop"
COMMANDS = {
    "run": ["run", "--database-url", DATABASE, "--sink", "kafka://127.0.0.1:9092"],
    "dead": ["dead", "--database-url", DATABASE],
    "skip": ["skip", "--id", "1", "--database-url", DATABASE],
}
NUMBER_FLAGS = [
    *(
        ("run", flag)
        for flag in (
            "--batch-size", "--batch-bytes", "--max-attempts", "--backoff-initial", "--backoff-max",
            "--lease-seconds", "--publish-timeout", "--poll-interval", "--poll-interval-max",
            "--pipeline-depth", "--metrics-port", "--startup-timeout",
        )
    ),
    ("dead", "--limit"),
    ("skip", "--publish-timeout"),
]  # fmt: skip
#: 1000 written in ways int() and float() take and nothing else in the relay does.
NOT_ASCII = ["1_000", "\u0661\u0660\u0660\u0660", "\uff11\uff10\uff10\uff10", "1\u0966\u0966\u0966", "1_0.5"]


@pytest.mark.parametrize("value", NOT_ASCII)
@pytest.mark.parametrize(("command", "flag"), NUMBER_FLAGS)
def test_a_number_not_in_ascii_digits_is_refused_from_flag_and_variable(
    served: list[Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    flag: str,
    value: str,
) -> None:
    error = refused([*COMMANDS[command], flag, value], capsys)
    assert f"argument {flag}: {value!r}" in error and "ASCII digits" in error, error
    variable = "RELAY_" + flag[2:].replace("-", "_").upper()
    monkeypatch.setenv(variable, value)
    error = refused(COMMANDS[command], capsys)
    assert f"{variable}: {value!r}" in error and "ASCII digits" in error, error
    assert served == []


@pytest.mark.parametrize("value", [" 1000", "1000 ", "+1000"])
def test_a_number_in_ascii_digits_is_still_taken_with_spaces_or_a_plus(served: list[Any], value: str) -> None:
    assert cli.main([*COMMANDS["run"], "--batch-size", value, "--metrics-port", value]) == 0
    assert served[0].settings.batch_size == 1000 and served[0].metrics_port == 1000
