"""A tiny HTTP server for /metrics, /healthz and /readyz on the relay's loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relay.errors import ConfigError, RelayError, SinkUnavailable
from relay.loop import Relay
from relay.sinks.routing import RoutingSink

logger = logging.getLogger(__name__)

READY_CHECK_TIMEOUT_SECONDS = 3.0
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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
        """
        if not self.started:
            return False
        sink = self.relay.sink
        try:
            async with asyncio.timeout(READY_CHECK_TIMEOUT_SECONDS):
                await self.relay.store.check()
                await sink.check()
            if isinstance(sink, RoutingSink) and sink.down():
                causes = "; ".join(f"{label}: {error}" for label, error in sink.down().items())
                raise SinkUnavailable(f"sinks down ({causes})")
        except (RelayError, TimeoutError) as exc:
            logger.info("not ready: %s", exc, extra={"action": "not_ready"})
            return False
        return True

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(READY_CHECK_TIMEOUT_SECONDS * 3):
                request = await reader.readline()
                while (await reader.readline()).strip():
                    pass
                parts = request.decode("latin-1").split()
                path = parts[1].split("?")[0] if len(parts) > 1 else "/"
                status, ctype, body = await self._route(path)
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

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
