"""How `outbox-relay run` stops: exit 0 and one "stopped" line, whatever signals come and whenever."""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.relay_support import relay_process


def wait_started(proc: object, seconds: float = 20) -> None:
    # The relay logs "relaying ... to ..." at INFO once started.
    stderr = proc.stderr  # type: ignore[attr-defined]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = stderr.readline()
        if "relaying" in line:
            return
    raise AssertionError("the relay did not start")


@pytest.mark.parametrize("repeats", [1, 3, 8])
@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_and_its_repeats_end_the_relay_with_exit_0(
    database_url: str, amqp_url: str, first: signal.Signals, repeats: int
) -> None:
    proc = relay_process(database_url, amqp_url, "--log-level", "INFO")
    wait_started(proc)
    proc.send_signal(first)
    for _ in range(repeats - 1):  # an orchestrator's second SIGTERM, a second Ctrl-C: while stopping or after
        time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    _, said = proc.communicate(timeout=30)  # and closes the pipes
    assert proc.returncode == 0, said
    assert f"received {first.name}, stopping" in said or repeats > 1
    assert "Traceback" not in said and said.count('"stopped"') + said.count(" stopped") >= 1, said


@dataclass
class SilentServer:
    """A port that accepts connections and never answers; ``accepted`` is set at the first connection."""

    port: int
    accepted: threading.Event


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    """A port that accepts connections and never answers: a database that hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    done, accepted = threading.Event(), threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
                accepted.set()
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield SilentServer(listener.getsockname()[1], accepted)
    done.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
def test_a_stop_while_start_up_waits_on_a_hung_database_is_a_stop(
    silent_server: SilentServer, amqp_url: str, scheme: str
) -> None:
    url = f"{scheme}://root@127.0.0.1:{silent_server.port}/outbox"
    proc = relay_process(url, amqp_url, "--log-level", "INFO")
    # Once it connects, it is past its imports and its signal handlers, and waits on the database (a fixed
    # 2 s was too short for the imports on a loaded machine: the SIGTERM came before the handlers).
    assert silent_server.accepted.wait(60), "the relay never connected to the database"
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, said = proc.communicate(timeout=60)
    assert proc.returncode == 0, said
    assert "stopped" in said and "Traceback" not in said, said
