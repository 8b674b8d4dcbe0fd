"""Fault scenarios record their verdicts; ``python -m tests.faults.report`` tabulates them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.checker import COLLECTOR_NOTES, Verdict

RESULTS = Path(os.environ.get("RELAY_FAULTS_RESULTS", ".faults-results"))
FULL = os.environ.get("RELAY_FAULTS_FULL") == "1"
#: --max-attempts for relays the kill scenarios SIGKILL: a crash counts as an attempt, and with the default 3
#: an event claimed by three relays in a row that died before settling it is dead-lettered (as designed) and parks
#: its key, which a run of kills on a loaded machine can bring about; those scenarios are about order and loss.
CRASH_ATTEMPTS = 10

Recorder = Callable[..., None]


def result_entry(
    scenario: str,
    test: str,
    verdict: Verdict | None,
    *,
    runs: int,
    events: int | None,
    note: str,
    collector: list[str],
) -> dict[str, object]:
    """One scenario's recorded result; ``collector`` is what Kafka collectors said meanwhile of events
    their live consumer missed, kept as a list and added to the note (the report shows the note)."""
    if collector:
        note = "; ".join(([note] if note else []) + [f"collector: {text}" for text in collector])
    return {
        "scenario": scenario,
        "test": test,
        "mode": "full" if FULL else "quick",
        "runs": runs,
        "events": events if events is not None else (verdict.committed if verdict else 0),
        "lost": verdict.lost if verdict else 0,
        "leaked": verdict.leaked if verdict else 0,
        "unexpected": verdict.unexpected if verdict else 0,
        "duplicates": verdict.duplicates if verdict else 0,
        "order_violations": verdict.order_violations if verdict else 0,
        "note": note,
        "collector": collector,
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Recorder:
    """``record(scenario, verdict, runs=N, note=...)`` writes one JSON file per scenario.

    What a Kafka collector said while the scenario ran of events its live consumer missed
    (:data:`COLLECTOR_NOTES`) is recorded with it, so that a miss made good by the fresh read
    is on record even when the scenario passes.
    """
    first_note = len(COLLECTOR_NOTES)

    def write(scenario: str, verdict: Verdict | None = None, *, runs: int = 1, events: int | None = None,
              note: str = "") -> None:  # fmt: skip
        RESULTS.mkdir(exist_ok=True)
        entry = result_entry(
            scenario,
            request.node.nodeid,
            verdict,
            runs=runs,
            events=events,
            note=note,
            collector=COLLECTOR_NOTES[first_note:],
        )
        name = "".join(c if c.isalnum() else "_" for c in scenario)[:80]
        (RESULTS / f"{name}.json").write_text(json.dumps(entry, indent=1))

    return write
