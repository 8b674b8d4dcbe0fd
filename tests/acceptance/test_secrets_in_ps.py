"""A password given on the command line is masked in the process's own arguments.

Every account on the host reads them (``ps``, ``/proc/PID/cmdline``), for as long as a relay runs;
``outbox-relay`` rewrites them with each secret masked as soon as it has read them. Each relay here
waits at start-up on a closed database port, long enough to be looked at.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devservers import free_port
from tests.acceptance.cli import spawn
from tests.unit.test_secrets import PASSWORDS, URLS, leaks

MASK = "***"


def _arguments(process: subprocess.Popen[str]) -> tuple[str, str]:
    """The process's arguments as /proc and ``ps`` show them, once it has masked them (or given up)."""
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    deadline = time.monotonic() + 20
    shown = ""
    while time.monotonic() < deadline and process.poll() is None:
        shown = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        if MASK in shown:
            break
        time.sleep(0.05)
    ps = subprocess.run(["ps", "-o", "args=", "-p", str(process.pid)], capture_output=True, text=True, check=False)
    return shown, ps.stdout


def _look(args: list[str]) -> tuple[str, str]:
    process = spawn(*args, "--startup-timeout", "30")
    try:
        return _arguments(process)
    finally:
        process.kill()
        process.communicate()


def _cases() -> dict[tuple[str, str], list[str]]:
    closed = free_port()
    database = {
        "postgresql": f"postgresql://app:{{pw}}@127.0.0.1:{closed}/shop",
        "mysql": f"mysql://app:{{pw}}@127.0.0.1:{closed}/shop",
    }
    cases: dict[tuple[str, str], list[str]] = {}
    for form, password in PASSWORDS.items():
        for kind, url in database.items():
            cases[(kind, form)] = ["run", "--database-url", url.format(pw=password), "--sink", "kafka://127.0.0.1:9"]
        for kind in ("amqp", "kafka"):
            sink = URLS[kind].format(pw=password)
            plain = database["postgresql"].replace("app:{pw}@", "app@")
            cases[(kind, form)] = ["run", "--database-url", plain, "--sink", sink]
            cases[(f"route to {kind}", form)] = ["run", "--database-url", plain, "--route", f"orders.*={sink}"]
    secret = next(iter(PASSWORDS.values()))
    plain = database["postgresql"].replace("app:{pw}@", "app@")
    cases[("kafka option", "sasl.password")] = [
        "run", "--database-url", plain, "--sink", f"kafka://k1.example:9092?sasl.username=u&sasl.password={secret}",
    ]  # fmt: skip
    cases[("libpq keywords", "password")] = [
        "run", "--database-url", f"host=127.0.0.1 port={closed} password={secret}", "--sink", "kafka://127.0.0.1:9",
    ]  # fmt: skip
    return cases


@pytest.mark.timeout(300)
def test_a_password_on_the_command_line_is_masked_in_ps_and_proc_cmdline() -> None:
    cases = _cases()
    with ThreadPoolExecutor(8) as pool:
        seen = dict(zip(cases, pool.map(_look, cases.values()), strict=True))
    for case, (cmdline, ps) in seen.items():
        assert MASK in cmdline and "--database-url" in cmdline, (case, cmdline)
        assert not leaks(cmdline) and not leaks(ps), (case, cmdline, ps)


def test_arguments_without_a_secret_are_left_as_given() -> None:
    closed = free_port()
    url = f"postgresql://app@127.0.0.1:{closed}/shop"
    process = spawn("run", "--database-url", url, "--sink", "kafka://h:9", "--startup-timeout", "30")
    try:
        time.sleep(1.5)
        assert process.poll() is None
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
    finally:
        process.kill()
        process.communicate()
    assert b"--database-url" in cmdline and url.encode() in cmdline
