"""Ctrl-C or SIGTERM while the throwaway servers start or run leaves no process and no directory behind.

The servers run in sessions of their own, so nothing stops them but their
owner: a process that dies without its clean-up leaves them running for good.
Each case runs the owner (a script using ``devservers``, or the demo) with a
marker in its environment, which every child inherits, and with a temporary
directory of its own; once the owner has exited, no process may carry the
marker and the directory must be empty.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.cli import env

MARK = "OUTBOX_RELAY_INTERRUPT_MARK"
SETTLE_SECONDS = 10.0

OWNER = """
import sys, time
from devservers import Tansu, embedded_postgres
server = Tansu() if sys.argv[1] == "tansu" else embedded_postgres()
with server:
    print("ready", flush=True)
    time.sleep(120)
"""


def marked(mark: str) -> list[int]:
    """The processes whose environment holds ``MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


@pytest.fixture
def temp_root() -> Iterator[Path]:
    """A temporary directory the owner's TMPDIR points at, enterable by the embedded PostgreSQL's account."""
    root = Path(tempfile.mkdtemp(prefix="outbox-relay-interrupt-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def as_in_a_terminal() -> None:
    """SIGINT at its default in the owner, as for a command typed at a terminal.

    A command started in the background by a shell without job control (``cmd &`` in a script,
    ``nohup``) inherits SIGINT ignored, and so do the tests' children when the suite itself runs
    that way: the owner would then rightly ignore the Ctrl-C these cases send it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(command: list[str], signum: signal.Signals, when: str, temp_root: Path) -> None:
    """Run ``command``; signal it once a child runs (``starting``) or it prints ``when``; check what is left."""
    mark = uuid.uuid4().hex
    owner = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(**{MARK: mark, "TMPDIR": str(temp_root)}),
        preexec_fn=as_in_a_terminal,
    )
    try:
        assert owner.stdout is not None
        deadline = time.monotonic() + 60
        if when == "starting":
            while not set(marked(mark)) - {owner.pid} and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            for line in owner.stdout:
                if when in line:
                    break
        assert owner.poll() is None, owner.communicate()
        owner.send_signal(signum)
        _, said = owner.communicate(timeout=60)
        left = marked(mark)
        settle = time.monotonic() + SETTLE_SECONDS
        while left and time.monotonic() < settle:  # a backend may take a moment to see its postmaster gone
            time.sleep(0.1)
            left = marked(mark)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for pipe in (owner.stdout, owner.stderr):  # closed here, not by a later test's garbage collection
            if pipe is not None:
                pipe.close()
        for pid in marked(mark):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"left running after {signum.name}: {left}; stderr: {said}"
    assert list(temp_root.iterdir()) == [], f"left in the temp dir: {list(temp_root.iterdir())}"
    assert "Traceback" not in said or "KeyboardInterrupt" in said, said


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["starting", "ready"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("server", ["tansu", "postgres"])
def test_an_interrupted_dev_server_leaves_nothing(
    server: str, signum: signal.Signals, when: str, temp_root: Path
) -> None:
    interrupt([sys.executable, "-c", OWNER, server], signum, when, temp_root)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["starting", "relay      pid"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_an_interrupted_demo_leaves_nothing(signum: signal.Signals, when: str, temp_root: Path) -> None:
    interrupt([sys.executable, "-m", "examples.demo", "--orders", "100000"], signum, when, temp_root)
