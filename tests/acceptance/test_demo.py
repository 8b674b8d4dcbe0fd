"""``python -m examples.demo`` with nothing configured: embedded servers, a clean report, exit 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.cli import env
from tests.services import listening

DEMO_TIMEOUT_SECONDS = 180


def report_value(stdout: str, label: str) -> int:
    """The number on the report line that starts with ``label``."""
    match = re.search(rf"^\s+{re.escape(label)}\s+(-?\d+)\b", stdout, re.MULTILINE)
    assert match, f"no {label!r} line in the report:\n{stdout}"
    return int(match.group(1))


@pytest.mark.timeout(DEMO_TIMEOUT_SECONDS + 20)
def test_demo_runs_green_on_embedded_servers() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo"],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_SECONDS,
        env=env(),  # no RELAY_DATABASE_URL, DATABASE_URL or RELAY_SINK: the demo starts its own
        check=False,
    )
    output = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, output
    assert "embedded PostgreSQL" in result.stdout, output
    assert "Tansu" in result.stdout, output

    assert report_value(result.stdout, "lost") == 0, output
    assert report_value(result.stdout, "leaked") == 0, output
    assert report_value(result.stdout, "order violations") == 0, output
    assert report_value(result.stdout, "relay exit code") == 0, output
    committed = report_value(result.stdout, "committed")
    rolled_back = report_value(result.stdout, "rolled back")
    assert committed > 0 and rolled_back > 0, output
    assert report_value(result.stdout, "delivered") == committed, output

    # The embedded PostgreSQL is gone once the demo has exited.
    port = re.search(r"embedded PostgreSQL, postgresql://\S+@127\.0\.0\.1:(\d+)/", result.stdout)
    assert port, output
    assert not listening("127.0.0.1", int(port.group(1))), "the demo left its PostgreSQL running"


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(DEMO_TIMEOUT_SECONDS + 20)
@pytest.mark.parametrize(
    ("home", "where", "pipe"),
    [
        ("HOME=/proc/no-home", "private", "| cat"),  # a home that cannot be written; a mode-0700 directory
        ("-u HOME", "/proc", "| head -3"),  # no home at all; a directory not even root can write
    ],
)
def test_the_demo_runs_without_a_writable_home_or_directory_and_through_a_pipe(
    tmp_path: Path, home: str, where: str, pipe: str
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    cwd = private if where == "private" else Path(where)
    done = subprocess.run(
        [
            "bash",
            "-c",
            f'env {home} "$@" {pipe}; echo "exit=${{PIPESTATUS[0]}}" >&2',
            "bash",
            sys.executable,
            "-m",
            "examples.demo",
            "--orders",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_SECONDS,
        env=env(PYTHONPATH=str(REPO)),
        cwd=cwd,
        check=False,
    )
    output = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "Traceback" not in done.stderr, output
    if pipe == "| cat":
        assert done.stderr.strip().endswith("exit=0") and "OK in" in done.stdout, output
    else:
        assert done.stderr.strip() == "exit=141" and len(done.stdout.splitlines()) == 3, output
    port = re.search(r"embedded PostgreSQL, postgresql://\S+@127\.0\.0\.1:(\d+)/", done.stdout)
    assert port, output
    assert not listening("127.0.0.1", int(port.group(1))), "the demo left its PostgreSQL running"
