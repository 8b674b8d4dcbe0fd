"""Each test suite has a ``make`` target that runs it (the Makefile once declared two with no recipe)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("suite", ["unit", "integration", "acceptance"])
def test_make_suite_runs_pytest_on_that_suite(suite: str) -> None:
    make = shutil.which("make")
    assert make is not None, "make is not installed: apt-get install make"
    # A make around this test run must not pass its own flags down.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    # -n prints the recipe without running it; a target without one prints "Nothing to be done".
    shown = subprocess.run(
        [make, "-n", suite], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert shown.returncode == 0, shown.stderr
    commands = shown.stdout.splitlines()
    assert any(line.endswith(f"pytest tests/{suite}") for line in commands), shown.stdout


def test_make_container_test_runs_the_container_tests() -> None:
    make = shutil.which("make")
    assert make is not None, "make is not installed: apt-get install make"
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    shown = subprocess.run(
        [make, "-n", "container-test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert shown.returncode == 0, shown.stderr
    commands = shown.stdout.splitlines()
    # The engine is checked first, so that a missing one is one message saying how to get it.
    checks = [i for i, line in enumerate(commands) if line.endswith("python -m tests.container.engine")]
    runs = [i for i, line in enumerate(commands) if "pytest tests/container" in line]
    assert checks and runs and checks[0] < runs[0], shown.stdout


def test_make_test_runs_the_parallel_suites_on_workers_then_every_other_test_alone() -> None:
    from tests.conftest import PARALLEL_SUITES

    make = shutil.which("make")
    assert make is not None, "make is not installed: apt-get install make"
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    shown = subprocess.run(
        [make, "-n", "test"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert shown.returncode == 0, shown.stderr
    recipe = shown.stdout
    side_by_side = recipe.find(f'pytest {" ".join(PARALLEL_SUITES)} -n 2 -m "not serial"')
    alone = recipe.find("pytest tests -m serial")
    assert 0 <= side_by_side < alone, recipe


def test_only_the_parallel_suites_run_beside_other_tests() -> None:
    # tests/faults stops the shared RabbitMQ: collected with a parallel suite, only the latter is "not serial".
    shown = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not serial",
         "tests/faults", "tests/unit/test_makefile.py", "tests/acceptance/test_probes.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    selected = [line for line in shown.stdout.splitlines() if "::" in line]
    assert selected and all(line.startswith("tests/acceptance/test_probes.py::") for line in selected), shown.stdout
