"""SIGTERM read as Ctrl-C while a throwaway server runs, so that its clean-up runs.

Python's default SIGTERM ends the process at once: no ``finally``, no
``__exit__``, no ``atexit``. The servers run in sessions of their own (a
terminal's Ctrl-C must not reach them before their clients stop), so they
would outlive it, and PostgreSQL's directory would stay in the temp dir.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM raises ``KeyboardInterrupt`` in the main thread; the old handler is back after.

    Only where SIGTERM still has Python's default: a program that handles it
    (the demo, a test runner) keeps its own handler. Elsewhere than in the
    main thread no handler can be set, and nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        # Servers started and stopped out of order: a handler set since then is not ours to undo.
        if signal.getsignal(signal.SIGTERM) is _interrupt:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside are acted on as it ends, not in the middle.

    For starting a child: an interrupt inside ``Popen()``, once the child is
    forked but before ``Popen`` returns, leaves a process nobody knows the id
    of, to run for good in its own session. Outside the main thread nothing
    changes (no handler can be set there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def defer(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, defer) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            handler = previous[signal.Signals(caught[0])]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(caught[0])
