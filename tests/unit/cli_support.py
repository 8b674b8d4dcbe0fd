"""What the CLI unit tests share."""

from __future__ import annotations

import pytest

from relay import cli


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``outbox-relay argv`` exits with, as a usage error (status 2)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]
