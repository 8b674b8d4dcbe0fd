"""Where the machine's CPU goes during a measurement, read from ``/proc``.

A drain shares two cores between PostgreSQL, the relay, the broker, the
measuring consumer and the kernel (which writes PostgreSQL's dirty pages
back). L_db has PostgreSQL and one client to itself. Reading both as CPU
microseconds per event, by group of processes, says which part of a ratio
below 1 is the relay's doing and which part is the other work S1 carries.

Processes that exit between two snapshots drop out of their group; what no
group accounts for lands in ``other``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import proc_cpu_seconds

#: Process names (``/proc/PID/stat`` field 2) of each group; the relay and the
#: bench's own process (where the measuring consumer runs) go by pid.
BROKER_NAMES = ("tansu", "beam.smp", "erl_child_setup", "epmd")
POSTGRES_NAME = "postgres"
KTHREADD_PID = 2

_TICKS = os.sysconf("SC_CLK_TCK")
_CPUS = os.cpu_count() or 1


@dataclass(frozen=True)
class Snapshot:
    """Cumulative CPU seconds at one moment: the machine's, and each group's."""

    at: float
    busy: float
    steal: float
    groups: dict[str, float]


def _machine() -> tuple[float, float]:
    """(busy, steal) CPU seconds of all CPUs since boot; busy leaves out idle, iowait and steal."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / _TICKS, steal / _TICKS


def _group(pid: int, name: str, ppid: int, relay_pids: Collection[int]) -> str:
    if pid in relay_pids:
        return "relay"
    if pid == os.getpid():
        return "bench"
    if name == POSTGRES_NAME:
        return "postgres"
    if name.startswith(BROKER_NAMES):
        return "broker"
    if pid == KTHREADD_PID or ppid == KTHREADD_PID:
        return "kernel"
    return "other"


def snapshot(relay_pid: int | Collection[int] | None = None) -> Snapshot:
    """CPU seconds used so far by the machine and by each group of processes (the relays' together)."""
    relay_pids = {relay_pid} if isinstance(relay_pid, int) else set(relay_pid or ())
    busy, steal = _machine()
    groups = {"relay": 0.0, "postgres": 0.0, "broker": 0.0, "bench": 0.0, "kernel": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        name = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        group = _group(int(entry.name), name, ppid, relay_pids)
        if group != "other":
            groups[group] += proc_cpu_seconds(text, _TICKS)
    return Snapshot(time.monotonic(), busy, steal, groups)


def per_event(start: Snapshot, end: Snapshot, events: int) -> dict[str, Any]:
    """CPU microseconds per event between two snapshots, in all and by group, and how busy the machine was."""
    wall = end.at - start.at
    if events <= 0 or wall <= 0:
        return {}
    busy = end.busy - start.busy
    groups = {name: (end.groups[name] - start.groups[name]) / events * 1e6 for name in start.groups}
    groups["other"] = busy / events * 1e6 - sum(groups.values())
    return {
        "machine_us_per_event": busy / events * 1e6,
        "machine_busy_share": busy / (wall * _CPUS),
        "steal_share": (end.steal - start.steal) / (wall * _CPUS),
        "groups_us_per_event": groups,
    }
