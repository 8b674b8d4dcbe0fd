"""RabbitMQ helpers for integration tests: temporary queues, a read-back, a faulty link.

Each test declares its own uniquely named queue (and exchange, if it needs
one), binds it for the routing keys it publishes to, reads back what arrived
and deletes everything on exit, so tests can run side by side on one broker::

    with temp_queue(amqp_url) as queue:  # default exchange: routing key = queue.name
        ...publish events with topic=queue.name...
        messages = queue.collect(3)

    with temp_exchange(amqp_url) as exchange, temp_queue(
        amqp_url, exchange=exchange, routing_keys=["orders"]
    ) as queue:
        ...

``TcpProxy`` sits between a client and the broker so a test can cut the
connection or hold back the broker's answers (confirms, heartbeats).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from pika.exchange_type import ExchangeType

COLLECT_TIMEOUT_SECONDS = 10.0
#: How long ``collect`` keeps listening after the expected count, to catch extras.
SETTLE_SECONDS = 0.3


def unique_name(prefix: str = "relay-test") -> str:
    """A queue, exchange or routing-key name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Message:
    """One message as a consumer sees it."""

    exchange: str
    routing_key: str
    body: bytes
    content_type: str | None
    delivery_mode: int | None
    message_id: str | None
    headers: dict[str, Any]


class TempQueue:
    """A queue that exists for the length of a ``with temp_queue(...)`` block."""

    def __init__(self, channel: BlockingChannel, name: str, exchange: str, routing_keys: Sequence[str]) -> None:
        self.channel = channel
        self.name = name
        self.exchange = exchange
        self.routing_keys = list(routing_keys)

    def count(self) -> int:
        """Messages ready in the queue right now."""
        declared = self.channel.queue_declare(self.name, passive=True)
        return int(declared.method.message_count or 0)

    def collect(
        self, expected: int, timeout: float = COLLECT_TIMEOUT_SECONDS, settle: float = SETTLE_SECONDS
    ) -> list[Message]:
        """Take (and ack) messages until ``expected`` arrived or ``timeout`` passed.

        Keeps taking for ``settle`` seconds more, so a test also sees messages
        it did not expect. Returns everything taken, in queue order.
        """
        messages: list[Message] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            method, properties, body = self.channel.basic_get(self.name, auto_ack=True)
            if method is None or properties is None:
                if len(messages) >= expected:
                    deadline = min(deadline, time.monotonic() + settle)
                time.sleep(0.02)
                continue
            messages.append(
                Message(
                    exchange=method.exchange or "",
                    routing_key=method.routing_key or "",
                    body=body if isinstance(body, bytes) else (body or "").encode(),
                    content_type=properties.content_type,
                    delivery_mode=properties.delivery_mode,
                    message_id=properties.message_id,
                    headers=_decode_headers(dict(properties.headers or {})),
                )
            )
        return messages

    def purge(self) -> None:
        """Drop every ready message."""
        self.channel.queue_purge(self.name)

    def bind(self, routing_key: str) -> None:
        """Also receive ``routing_key`` from this queue's (named) exchange."""
        self.channel.queue_bind(self.name, self.exchange, routing_key=routing_key)
        self.routing_keys.append(routing_key)


@contextlib.contextmanager
def rabbit_channel(amqp_url: str) -> Iterator[BlockingChannel]:
    """A blocking channel for set-up and read-back; closed on exit."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        yield connection.channel()
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            connection.close()


@contextlib.contextmanager
def temp_exchange(amqp_url: str, exchange_type: str = "direct") -> Iterator[str]:
    """A new durable exchange with a unique name; deleted on exit."""
    name = unique_name("relay-test-x")
    with rabbit_channel(amqp_url) as channel:
        channel.exchange_declare(name, exchange_type=ExchangeType(exchange_type), durable=True)
        try:
            yield name
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError):
                channel.exchange_delete(name)


@contextlib.contextmanager
def temp_queue(
    amqp_url: str,
    *,
    exchange: str = "",
    routing_keys: Sequence[str] = (),
    name: str | None = None,
    arguments: dict[str, Any] | None = None,
) -> Iterator[TempQueue]:
    """A new durable queue with a unique name; deleted (with its messages) on exit.

    On the default exchange (``exchange=""``) the queue receives the routing
    key equal to its name, as RabbitMQ binds every queue there; on a named
    exchange it is bound for each of ``routing_keys``. ``arguments`` are the
    queue's ``x-`` arguments (e.g. ``{"x-max-length": 1, "x-overflow":
    "reject-publish"}`` makes the broker nack what does not fit).
    """
    queue_name = name or unique_name()
    with rabbit_channel(amqp_url) as channel:
        channel.queue_declare(queue_name, durable=True, arguments=arguments)
        try:
            if exchange:
                for key in routing_keys:
                    channel.queue_bind(queue_name, exchange, routing_key=key)
            keys = list(routing_keys) if exchange else [queue_name]
            yield TempQueue(channel, queue_name, exchange, keys)
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError):
                channel.queue_delete(queue_name)


def via_proxy(amqp_url: str, proxy: TcpProxy) -> str:
    """``amqp_url`` pointed at ``proxy`` instead of the broker."""
    parts = urlsplit(amqp_url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


class TcpProxy:
    """Forwards a loopback port to the broker; tests cut or stall the link.

    ``stall()`` keeps forwarding what the client sends but holds back every
    byte the broker sends (confirms, heartbeats), as a congested or half-dead
    network would; ``resume()`` lets it through. ``cut()`` closes every
    connection in flight; new ones are accepted as before.
    """

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self.port: int = self._listener.getsockname()[1]
        self._peers: dict[socket.socket, socket.socket] = {}
        self._upstream: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stalled = False
        self._cut_requested = threading.Event()
        self._cut_done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)

    @classmethod
    def to(cls, amqp_url: str) -> TcpProxy:
        """A proxy to the broker of ``amqp_url``."""
        parts = urlsplit(amqp_url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5672)

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            for sock in list(self._peers):
                sock.close()
            self._peers.clear()
        self._listener.close()

    @property
    def connections(self) -> int:
        """Client connections open through the proxy now."""
        with self._lock:
            return len(self._peers) // 2

    def stall(self) -> None:
        """Hold back everything the broker sends from now on."""
        self._stalled = True

    def resume(self) -> None:
        """Forward the broker's bytes again, those held back first."""
        self._stalled = False

    def cut(self) -> None:
        """Close every connection through the proxy, as a network failure would."""
        self._cut_done.clear()
        self._cut_requested.set()
        self._cut_done.wait(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._cut_requested.is_set():
                with self._lock:
                    for sock in list(self._peers):
                        sock.close()
                    self._peers.clear()
                    self._upstream.clear()
                self._cut_requested.clear()
                self._cut_done.set()
            with self._lock:
                watched = [s for s in self._peers if not (self._stalled and s in self._upstream)]
            readable, _, _ = select.select([self._listener, *watched], [], [], 0.02)
            for sock in readable:
                if sock is self._listener:
                    self._accept()
                else:
                    self._forward(sock)

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        try:
            upstream = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        with self._lock:
            self._peers[client] = upstream
            self._peers[upstream] = client
            self._upstream.add(upstream)

    def _forward(self, sock: socket.socket) -> None:
        with self._lock:
            peer = self._peers.get(sock)
        if peer is None:
            return
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        with self._lock:
            for end in (sock, peer):
                self._peers.pop(end, None)
                self._upstream.discard(end)
                end.close()


def _decode_headers(headers: dict[str, Any]) -> dict[str, Any]:
    # AMQP long strings may come back as bytes; tests compare with str.
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in headers.items()}
