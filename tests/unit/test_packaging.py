"""The distribution's version is written once, in pyproject.toml, and read from its metadata."""

from __future__ import annotations

import tomllib
from pathlib import Path

import relay

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_comes_from_pyproject_through_the_metadata() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert relay.__version__ == declared
    written = [path for path in (ROOT / "relay").rglob("*.py") if f'"{declared}"' in path.read_text(encoding="utf-8")]
    assert not written, f"the version is written again in {written}"
