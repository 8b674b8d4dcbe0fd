"""``replay --since A --until B`` with B not after A (swapped, equal, or so once time zones are
read) is refused: no event was sent in that window, and "replayed 0 events" hid the mistake.

No server is reached: the admin commands' store is stubbed.
"""

from __future__ import annotations

from typing import Any

import pytest

from relay import cli
from relay.cli import admin

REPLAY = ["replay", "--database-url", "postgresql://app@127.0.0.1:1/shop"]


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The arguments of each replay that reached the store."""
    seen: list[Any] = []

    def on_admin(args: Any, work: Any) -> list[int]:
        seen.append(args)
        return []

    monkeypatch.setattr(admin, "_on_admin", on_admin)
    return seen


@pytest.mark.parametrize(
    ("since", "until"),
    [
        ("2026-01-02", "2026-01-01"),
        ("2026-01-01T12:00:00", "2026-01-01T12:00:00"),
        ("2026-01-01T00:00:00", "2026-01-01T00:00:00+00:00"),  # no zone is UTC: the same instant
        ("2026-01-01T01:00:00+00:00", "2026-01-01T02:00:00+02:00"),  # later on the clock, earlier in time
        ("2026-01-01T00:00:00.000001", "2026-01-01T00:00:00"),
    ],
)
def test_an_until_not_after_since_is_refused(
    replayed: list[Any], capsys: pytest.CaptureFixture[str], since: str, until: str
) -> None:
    assert cli.main([*REPLAY, "--since", since, "--until", until, "--key", "k"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "is not after --since" in lines[0], lines
    assert replayed == []


@pytest.mark.parametrize(
    ("since", "until"),
    [("2026-01-01", "2026-01-02"), ("2026-01-01T00:00:00+02:00", "2026-01-01T00:00:00"), ("2026-01-01", None)],
)
def test_a_window_with_room_in_it_is_replayed(replayed: list[Any], since: str, until: str | None) -> None:
    argv = [*REPLAY, "--since", since, *(["--until", until] if until else [])]
    assert cli.main(argv) == 0
    assert len(replayed) == 1
