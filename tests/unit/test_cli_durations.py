"""Duration flags (``run --retention``, ``purge --older-than``) and their variables: a refused value
is a one-line error that names the flag or the variable it came from, as for every other flag.

No server is reached: ``serve`` and the admin commands' store are stubbed.
"""

from __future__ import annotations

from typing import Any

import pytest

from relay import app, cli
from relay.cli import admin
from tests.unit.cli_support import refused

DATABASE = "postgresql://app@127.0.0.1:1/shop"
RUN = ["run", "--database-url", DATABASE, "--sink", "kafka://127.0.0.1:9092"]
PURGE = ["purge", "--database-url", DATABASE]
FLAGS = [(RUN, "--retention"), (PURGE, "--older-than")]
BAD = [" ", "abc", "nan", "inf", "1e999", "5ms", "10 s s", "1y", "-1", "1_000", "\u0661\u0660d", "99999999999d"]


@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What ``serve`` was given, and each ``purge``'s --older-than in seconds."""
    seen: list[Any] = []

    async def serve(run_config: Any) -> None:
        seen.append(run_config.retention_seconds)

    def on_admin(args: Any, work: Any) -> int:
        seen.append(args.older_than)
        return 0

    monkeypatch.setattr(app, "serve", serve)
    monkeypatch.setattr(admin, "_on_admin", on_admin)
    return seen


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize(("command", "flag"), FLAGS, ids=["retention", "older-than"])
def test_a_bad_duration_names_its_flag_or_variable(
    stubbed: list[Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    flag: str,
    value: str,
) -> None:
    error = refused([*command, f"{flag}={value}"], capsys)
    assert error.startswith(f"outbox-relay {command[0]}: error: argument {flag}: invalid duration"), error
    variable = "RELAY_" + flag[2:].replace("-", "_").upper()
    monkeypatch.setenv(variable, value)
    error = refused(command, capsys)
    assert error.startswith(f"outbox-relay: error: {variable}: invalid duration"), error
    assert stubbed == []


@pytest.mark.parametrize(("command", "flag"), FLAGS, ids=["retention", "older-than"])
@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("90", 90.0), ("1.5m", 90.0), (" 7d ", 604800.0)])
def test_a_duration_reaches_the_command_in_seconds(
    stubbed: list[Any], command: list[str], flag: str, value: str, seconds: float
) -> None:
    assert cli.main([*command, flag, value]) == 0
    assert stubbed == [seconds]


def test_an_empty_retention_is_unset_and_an_empty_older_than_is_asked_for(
    stubbed: list[Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAY_RETENTION", "")
    assert cli.main(RUN) == 0
    assert stubbed == [None]
    monkeypatch.setenv("RELAY_OLDER_THAN", "")
    assert "purge needs --older-than" in refused_by_command(PURGE, capsys)


def refused_by_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    return capsys.readouterr().err
