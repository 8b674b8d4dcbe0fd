"""Loopback ports for the throwaway servers: pick a free one, wait until one listens."""

from __future__ import annotations

import socket
import time

START_TIMEOUT_SECONDS = 20.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(host: str, port: int, timeout: float = START_TIMEOUT_SECONDS) -> None:
    """Block until ``host:port`` accepts a TCP connection, or raise ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)
