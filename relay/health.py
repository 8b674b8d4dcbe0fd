"""A tiny HTTP server for /metrics, /healthz and /readyz on the relay's loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relay.errors import ConfigError, RelayError
from relay.loop import Relay
from relay.sinks.routing import RoutingSink

logger = logging.getLogger(__name__)

READY_CHECK_TIMEOUT_SECONDS = 3.0
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def request_is_head(request: bytes) -> bool:
    """Whether the request line asks for the headers only (HEAD: the same answer, no body)."""
    return request.startswith(b"HEAD ")


class HealthServer:
    """Serves the relay's metrics and probes; one request per connection."""

    def __init__(self, relay: Relay, host: str, port: int) -> None:
        self.relay = relay
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        #: Set once the relay has connected: until then it is not ready, and a
        #: probe must not open connections that start-up would not close.
        self.started = False
        self._checks: asyncio.Task[str | None] | None = None
        self._checking = "the database"

    async def start(self) -> None:
        """Listen on ``host:port`` (port 0 picks a free one, stored back in ``port``).

        A port already taken or a host that does not resolve is a configuration
        mistake: :class:`ConfigError`, one line.
        """
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {self.host}:{self.port}: {exc.strerror or exc} "
                "(set --metrics-port / RELAY_METRICS_PORT, --metrics-host / RELAY_METRICS_HOST)"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        logger.info("serving metrics on %s:%d", self.host, self.port, extra={"action": "metrics_listen"})

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def alive(self) -> bool:
        """True unless the relay loop is wedged (see :meth:`relay.loop.Relay.alive`)."""
        return self.relay.alive()

    async def ready(self) -> bool:
        """True when the database and the broker answer; with routes, every route's broker.

        A routed sink that is down holds back its events while the others flow:
        the relay is working, but not for everything, so it is not ready.

        The checks run as one task that probes share and that a probe never
        cancels: a probe answers "not ready" once they take longer than
        ``READY_CHECK_TIMEOUT_SECONDS``, and the next probes wait on the same
        checks. Cancelled, a check on a database that stopped answering would
        take psycopg's cancellation (several seconds more, and the relay's
        connection closed) before any answer went out.
        """
        if not self.started:
            return False
        if self._checks is None or self._checks.done():
            self._checks = asyncio.create_task(self._check(), name="readiness checks")
            # Retrieve the outcome even when no probe waits for it any more.
            self._checks.add_done_callback(lambda task: task.cancelled() or task.exception())
        done, _ = await asyncio.wait({self._checks}, timeout=READY_CHECK_TIMEOUT_SECONDS)
        if not done:
            logger.info(
                "not ready: %s did not answer within %g s",
                self._checking,
                READY_CHECK_TIMEOUT_SECONDS,
                extra={"action": "not_ready"},
            )
            return False
        problem = self._checks.result()
        if problem is not None:
            logger.info("not ready: %s", problem, extra={"action": "not_ready"})
        return problem is None

    async def _check(self) -> str | None:
        """What keeps the relay from being ready, or None."""
        sink = self.relay.sink
        try:
            self._checking = "the database"
            await self.relay.store.check()
            self._checking = "the broker" if not isinstance(sink, RoutingSink) else "a routed broker"
            await sink.check()
        except RelayError as exc:
            return str(exc) or type(exc).__name__
        if isinstance(sink, RoutingSink) and sink.down():
            return "sinks down (" + "; ".join(f"{label}: {error}" for label, error in sink.down().items()) + ")"
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READY_CHECK_TIMEOUT_SECONDS * 3):
                request = b""
                try:
                    request = await reader.readline()
                    while (await reader.readline()).strip():
                        pass
                except ValueError:  # a line past the reader's limit (64 KiB)
                    status, extra, body = "431 Request Header Fields Too Large", "", b"request too large\n"
                    ctype = "text/plain"
                else:
                    status, ctype, extra, body = await self._answer(request)
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    f"{extra}Connection: close\r\n\r\n".encode()
                    + (b"" if request_is_head(request) else body)
                )
                await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, request: bytes) -> tuple[str, str, str, bytes]:
        """Status, content type, extra header lines and body for one request line."""
        parts = request.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", "text/plain", "", b"bad request\n"
        if parts[0] not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", "Allow: GET, HEAD\r\n", b"method not allowed\n"
        status, ctype, body = await self._route(parts[1].split("?")[0])
        return status, ctype, "", body

    async def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", PROMETHEUS_CONTENT_TYPE, self.relay.metrics.render()
        if path == "/healthz":
            ok = self.alive()
        elif path == "/readyz":
            ok = await self.ready()
        else:
            return "404 Not Found", "text/plain", b"not found\n"
        return ("200 OK", "text/plain", b"ok\n") if ok else ("503 Service Unavailable", "text/plain", b"unavailable\n")
