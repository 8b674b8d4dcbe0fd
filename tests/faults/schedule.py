"""Faults under load: writers that keep writing until the last fault has ended.

A fault scenario proves something only while the writers are writing. Writers
paced to "outlast the faults" do so on a quiet machine and not on a busy one,
where a late fault meets an idle outbox and the scenario fails its own
precondition (or, worse, passes without testing anything). Here the writers
write their quota and then go on until the schedule is over, plus a margin,
and every fault starts only once the writers have committed something since
the previous one::

    writers = Writers(database_url, topic, events=6_000, pause=0.04)
    with FaultSchedule(writers) as schedule:
        for n in range(3):
            with schedule.fault(f"black hole {n + 1}"):
                proxy.blackhole()
                time.sleep(20)
                proxy.passthrough()
    # the writers wrote for MARGIN_SECONDS more, stopped, and were joined
    assert not schedule.unloaded(), schedule.note()
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from tests.faults.checker import Writers

if TYPE_CHECKING:
    from tests.faults.proxy import FaultProxy

#: How long the writers go on after the last fault, so the recovery is under load too.
MARGIN_SECONDS = 3.0
#: How long a fault waits for the writers to commit something before it starts.
PATIENCE_SECONDS = 60.0


@dataclass(frozen=True)
class FaultLoad:
    """One fault of the schedule and what the writers committed while it lasted."""

    name: str
    commits: int
    seconds: float


class FaultSchedule:
    """Runs ``writers`` for the length of a ``with`` block and ``margin`` seconds after it.

    The writers write at least the events they were given; past that they go
    on until the block has ended and the margin has passed. Leaving the block
    with an exception stops them at once, without waiting.
    """

    def __init__(self, writers: Writers, *, margin: float = MARGIN_SECONDS, patience: float = PATIENCE_SECONDS) -> None:
        self.writers = writers
        self.margin = margin
        self.patience = patience
        self.faults: list[FaultLoad] = []
        self._until = threading.Event()
        self._mark = 0
        self._started: tuple[float, int] | None = None
        self._finished = False

    def __enter__(self) -> Self:
        self.writers.start(until=self._until)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.finish()
            return
        self._until.set()
        self._finished = True
        self.writers.stop()
        with contextlib.suppress(BaseException):  # the exception that left the block is the one to see
            self.writers.join(timeout=10)

    def wait_for_commits(self, n: int = 1) -> None:
        """Block until the writers committed ``n`` events since the last fault ended (or since they started)."""
        deadline = time.monotonic() + self.patience
        while self.writers.committed() < self._mark + n:
            if self.writers.errors:
                raise self.writers.errors[0]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the writers committed {self.writers.committed() - self._mark} of {n} events in "
                    f"{self.patience:g} s; no fault starts without load"
                )
            time.sleep(0.02)

    @contextlib.contextmanager
    def fault(self, name: str) -> Iterator[None]:
        """Wait for fresh commits, then time the block as the fault ``name`` and count the commits in it."""
        self.begin()
        yield
        self.end(name)

    def begin(self) -> None:
        """A fault starts now (once the writers committed something since the last one)."""
        self.wait_for_commits(1)
        self._started = (time.monotonic(), self.writers.committed())

    def end(self, name: str) -> None:
        """The fault begun last ends now; it is recorded as ``name``."""
        assert self._started is not None, "end() without begin()"
        started_at, committed_before = self._started
        self._started = None
        self._mark = self.writers.committed()
        self.faults.append(FaultLoad(name, self._mark - committed_before, time.monotonic() - started_at))

    def finish(self) -> None:
        """Let the writers write ``margin`` seconds more, stop them and join them (raising what they raised)."""
        if self._finished:
            return
        self._finished = True
        time.sleep(self.margin)
        self._until.set()
        self.writers.join()

    def unloaded(self) -> list[str]:
        """The faults during which the writers committed nothing."""
        return [f.name for f in self.faults if not f.commits]

    def note(self) -> str:
        """One line for a scenario's note: how much load the faults met."""
        if not self.faults:
            return "no faults"
        least = min(self.faults, key=lambda f: f.commits)
        return (
            f"writers on from before the first of {len(self.faults)} faults (each begun after fresh commits) to "
            f"{self.margin:g} s after the last; fewest commits during one: {least.commits} ({least.name})"
        )


@dataclass(frozen=True)
class LinkFault:
    """One fault of a link: its name in the schedule, how to start it on the proxy, how long it lasts."""

    name: str
    start: Callable[[FaultProxy], None]
    seconds: float


def link_fault_rounds(
    schedule: FaultSchedule, proxy: FaultProxy, faults: Sequence[LinkFault], rounds: int, *, pause: float = 1.0
) -> None:
    """``rounds`` times: a pause, then each fault in turn for its time; the link passes again after each round."""
    for n in range(1, rounds + 1):
        time.sleep(pause)
        for fault in faults:
            with schedule.fault(f"{fault.name} #{n}"):
                fault.start(proxy)
                time.sleep(fault.seconds)
        proxy.passthrough()
