"""Test databases made ahead of the tests and dropped behind them, off the tests' clock.

A database per test keeps tests apart, but making one and dropping it cost more than
many of the tests themselves: a clone of the migrated template writes the whole
template to the WAL, a PostgreSQL DROP DATABASE forces a checkpoint, and a MariaDB
database is migrated table by table (about a second a test in all, on each server).
A :class:`Stock` keeps one database ready, made by a thread while the test before
runs; a :class:`Dropper` drops used databases in a thread, several at a time, so
that PostgreSQL's drops share their checkpoints. Each test still gets a database
of its own that no other test used.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: Databases made ahead of the tests by a stock (one is enough: a test takes longer than a clone).
AHEAD = 1
#: The most used databases a dropper lets wait (drops run together once this many wait).
DROP_BATCH = 8
#: How long a test waits for its database before the stock's thread is taken as stuck.
TAKE_TIMEOUT_SECONDS = 120.0


class Dropper:
    """Drops used databases with ``drop(name)`` in a thread, ``DROP_BATCH`` at a time, concurrently."""

    def __init__(self, drop: Callable[[str], Any]) -> None:
        self._drop = drop
        self._names: queue.Queue[str | None] = queue.Queue()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._main, name="test-db-dropper", daemon=True)
        self._thread.start()

    def put(self, name: str, *, check: bool = True) -> None:
        """Drop ``name`` soon; with ``check``, first raise a drop error from earlier, as an inline drop would."""
        if check:
            self._raise()
        self._names.put(name)

    def close(self) -> None:
        """Drop what is left and wait for it."""
        self._names.put(None)
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._errors:
            raise RuntimeError("dropping a test database failed") from self._errors[0]

    def _main(self) -> None:
        with ThreadPoolExecutor(DROP_BATCH, thread_name_prefix="test-db-drop") as pool:
            done = False
            while not done:
                batch: list[str] = []
                while len(batch) < DROP_BATCH:
                    name = self._names.get()
                    if name is None:
                        done = True
                        break
                    batch.append(name)
                for future in [pool.submit(self._drop, name) for name in batch]:
                    try:
                        future.result()
                    except Exception as exc:  # noqa: BLE001 - raised in the tests' thread by put() or close()
                        self._errors.append(exc)


class Stock:
    """Databases made by ``make()`` (which returns a name) in a thread, ``AHEAD`` ready at a time.

    The thread starts with the first :meth:`take`, so a run that needs none makes none.
    """

    def __init__(self, make: Callable[[], str], dropper: Dropper) -> None:
        self._make = make
        self._dropper = dropper
        self._ready: queue.Queue[str | BaseException] = queue.Queue(maxsize=AHEAD)
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> str:
        """A new database's name, made for this caller alone."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="test-db-stock", daemon=True)
            self._thread.start()
        made = self._ready.get(timeout=TAKE_TIMEOUT_SECONDS)
        if isinstance(made, BaseException):
            raise RuntimeError("making a test database failed") from made
        return made

    def close(self) -> None:
        """Stop making databases and hand the ones not taken to the dropper."""
        self._closing.set()
        if self._thread is not None:
            while self._thread.is_alive():
                self._take_back()
                self._thread.join(0.05)
        self._take_back()

    def _take_back(self) -> None:
        try:
            made = self._ready.get_nowait()
        except queue.Empty:
            return
        if isinstance(made, str):
            self._dropper.put(made, check=False)

    def _main(self) -> None:
        while not self._closing.is_set():
            try:
                made: str | BaseException = self._make()
            except Exception as exc:  # noqa: BLE001 - handed to the test that takes it, as an inline make fails it
                made = exc
            while True:
                try:
                    self._ready.put(made, timeout=0.1)
                    break
                except queue.Full:
                    if self._closing.is_set():
                        if isinstance(made, str):
                            self._dropper.put(made, check=False)
                        return
