"""CI runs the install test: ``make install-test`` after ``make test``, which leaves it out."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_make_install_test_after_make_test() -> None:
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text("utf-8").splitlines()]
    assert "make test" in steps and "make install-test" in steps
    assert steps.index("make install-test") > steps.index("make test")


def test_make_install_test_runs_the_install_suite_and_make_test_leaves_it_out() -> None:
    make = shutil.which("make")
    assert make is not None, "make is not installed: apt-get install make"
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    shown = subprocess.run(
        [make, "-n", "install-test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert shown.returncode == 0, shown.stderr
    assert any(line.endswith("pytest tests/install") for line in shown.stdout.splitlines()), shown.stdout
    options = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["pytest"]["ini_options"]
    assert "--ignore=tests/install" in options["addopts"].split()
