"""Fault scenarios record their verdicts; ``python -m tests.faults.report`` tabulates them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.checker import Verdict

RESULTS = Path(os.environ.get("RELAY_FAULTS_RESULTS", ".faults-results"))
FULL = os.environ.get("RELAY_FAULTS_FULL") == "1"
#: --max-attempts for relays the kill scenarios SIGKILL: a crash counts as an attempt, and with the default 3
#: an event claimed by three relays in a row that died before settling it is dead-lettered (as designed) and parks
#: its key, which a run of kills on a loaded machine can bring about; those scenarios are about order and loss.
CRASH_ATTEMPTS = 10

Recorder = Callable[..., None]


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Recorder:
    """``record(scenario, verdict, runs=N, note=...)`` writes one JSON file per scenario."""

    def write(scenario: str, verdict: Verdict | None = None, *, runs: int = 1, events: int | None = None,
              note: str = "") -> None:  # fmt: skip
        RESULTS.mkdir(exist_ok=True)
        entry = {
            "scenario": scenario,
            "test": request.node.nodeid,
            "mode": "full" if FULL else "quick",
            "runs": runs,
            "events": events if events is not None else (verdict.committed if verdict else 0),
            "lost": verdict.lost if verdict else 0,
            "leaked": verdict.leaked if verdict else 0,
            "unexpected": verdict.unexpected if verdict else 0,
            "duplicates": verdict.duplicates if verdict else 0,
            "order_violations": verdict.order_violations if verdict else 0,
            "note": note,
            "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        name = "".join(c if c.isalnum() else "_" for c in scenario)[:80]
        (RESULTS / f"{name}.json").write_text(json.dumps(entry, indent=1))

    return write
