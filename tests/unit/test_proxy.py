"""The fault proxy against a tiny echo server on loopback (no external servers)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.timeout(30)


class EchoServer:
    """Echoes every byte back, one thread per connection."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clients: list[socket.socket] = []
        self._lock = threading.Lock()
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> EchoServer:
        self._listener.settimeout(0.05)
        self._accepting.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._accepting.join(5)
        with self._lock:
            for client in self._clients:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        with self._lock:
            for client in self._clients:
                client.close()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            with self._lock:
                self._clients.append(client)
            thread = threading.Thread(target=self._echo, args=(client,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                client.sendall(data)


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    with EchoServer() as server:
        yield server


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", echo.port) as running:
        yield running


@contextlib.contextmanager
def client(proxy: FaultProxy, timeout: float = 2.0) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)
    try:
        yield sock
    finally:
        sock.close()


def roundtrip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    received = b""
    while len(received) < len(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        received += chunk
    return received


def outcome_of_recv(sock: socket.socket) -> str:
    """'reset', 'eof', 'timeout' or 'data' for the next recv."""
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return "timeout"
    return "data" if data else "eof"


def test_passes_bytes_both_ways(proxy: FaultProxy) -> None:
    with client(proxy) as sock:
        assert roundtrip(sock, b"hello" * 1000) == b"hello" * 1000
        assert proxy.connections == 1
    assert proxy.mode == "pass"


def test_latency_delays_each_direction(proxy: FaultProxy) -> None:
    proxy.latency(0.2)
    with client(proxy) as sock:
        started = time.monotonic()
        assert roundtrip(sock) == b"ping"
        assert time.monotonic() - started >= 0.4
        proxy.passthrough()
        started = time.monotonic()
        assert roundtrip(sock) == b"ping"
        assert time.monotonic() - started < 0.2


@pytest.mark.parametrize(("direction", "arrives_late"), [("down", False), ("up", True)])
def test_latency_can_delay_one_direction_only(direction: str, arrives_late: bool) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    with server, FaultProxy("127.0.0.1", server.getsockname()[1]) as proxy:
        proxy.latency(0.3, direction=direction)
        with client(proxy) as sock:
            upstream, _ = server.accept()
            with upstream:
                started = time.monotonic()
                sock.sendall(b"ping")
                assert upstream.recv(16) == b"ping"
                arrived = time.monotonic() - started
                upstream.sendall(b"pong")
                assert sock.recv(16) == b"pong"
                round_trip = time.monotonic() - started
    assert (arrived >= 0.3) is arrives_late, arrived
    assert 0.3 <= round_trip < 0.55, round_trip


def test_blackhole_swallows_then_resets_only_connections_that_lost_bytes(proxy: FaultProxy) -> None:
    with client(proxy, timeout=0.5) as busy, client(proxy, timeout=0.5) as idle:
        assert roundtrip(busy) == b"ping"
        assert roundtrip(idle) == b"ping"
        proxy.blackhole()
        busy.sendall(b"lost")
        assert outcome_of_recv(busy) == "timeout"
        with client(proxy, timeout=0.5) as new:
            new.sendall(b"hello?")
            assert outcome_of_recv(new) == "timeout"
            assert proxy.connections == 3
            proxy.passthrough()
            assert outcome_of_recv(new) == "reset"
        assert outcome_of_recv(busy) == "reset"
        assert roundtrip(idle) == b"ping"
    with client(proxy) as fresh:
        assert roundtrip(fresh) == b"ping"


def test_reset_resets_existing_and_new_connections(proxy: FaultProxy) -> None:
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.reset()
        assert outcome_of_recv(sock) == "reset"
    # A new connection is reset either during the handshake or on its first read.
    try:
        with client(proxy) as sock:
            assert outcome_of_recv(sock) == "reset"
    except ConnectionResetError:
        pass
    proxy.passthrough()
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_slow_close_goes_silent_then_half_closes_then_closes(proxy: FaultProxy) -> None:
    with client(proxy, timeout=0.2) as sock:
        assert roundtrip(sock) == b"ping"
        started = time.monotonic()
        proxy.slow_close(0.5)
        sock.sendall(b"anyone?")
        assert outcome_of_recv(sock) == "timeout"
        sock.settimeout(3)
        assert outcome_of_recv(sock) == "eof"
        assert 0.4 <= time.monotonic() - started < 1.5
        sock.sendall(b"still writable after the half-close")
        assert proxy.connections == 1
        deadline = time.monotonic() + 3
        while proxy.connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proxy.connections == 0
    with client(proxy, timeout=3) as new:
        new.sendall(b"x")
        assert outcome_of_recv(new) == "eof"


def test_cut_closes_existing_connections_and_keeps_accepting(proxy: FaultProxy) -> None:
    with client(proxy) as first, client(proxy) as second:
        assert roundtrip(first) == b"ping"
        assert roundtrip(second) == b"ping"
        proxy.cut()
        assert outcome_of_recv(first) == "eof"
        assert outcome_of_recv(second) == "eof"
        assert proxy.connections == 0
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.cut(reset=True)
        assert outcome_of_recv(sock) == "reset"


def test_a_down_upstream_resets_the_client() -> None:
    with socket.create_server(("127.0.0.1", 0)) as placeholder:
        port = placeholder.getsockname()[1]
    with FaultProxy("127.0.0.1", port) as proxy:
        try:
            with client(proxy) as sock:
                outcome = outcome_of_recv(sock)
        except ConnectionResetError:  # the reset can reach the client before connect() returns
            outcome = "reset"
    assert outcome == "reset"


def test_mode_switches_are_thread_safe(proxy: FaultProxy) -> None:
    errors: list[BaseException] = []

    def flip(n: int) -> None:
        try:
            for i in range(20):
                proxy.latency(0.001) if (i + n) % 2 else proxy.passthrough()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=flip, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    with client(proxy) as sock:
        for _ in range(10):
            assert roundtrip(sock) == b"ping"
    for thread in threads:
        thread.join(10)
    assert not errors
    assert proxy.mode in ("pass", "latency")
