"""Run the CLI as a user would: a subprocess with a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys

CANARY = "Canary-pw-7f3a"


def env(**extra: str) -> dict[str, str]:
    """The test process's environment without any RELAY_* or DATABASE_URL, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_") and k != "DATABASE_URL"}
    return {**base, **extra}


def cli(*args: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``outbox-relay ARGS`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "relay", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(**extra),
        check=False,
    )


def spawn(*args: str, **extra: str) -> subprocess.Popen[str]:
    """Start ``outbox-relay ARGS`` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "relay", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(**extra),
    )
