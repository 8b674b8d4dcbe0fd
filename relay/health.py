"""A tiny HTTP server for /metrics, /healthz and /readyz on the relay's loop.

It must keep answering the probes whatever else connects: it holds at most
``MAX_CONNECTIONS`` connections, gives a client ``REQUEST_TIMEOUT_SECONDS`` to
send its request, and at the cap makes room by closing the connection that
has waited longest for a request that never came.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relay.errors import ConfigError, RelayError
from relay.loop import Relay
from relay.sinks.routing import RoutingSink

logger = logging.getLogger(__name__)

READY_CHECK_TIMEOUT_SECONDS = 3.0
#: How long a finished readiness check answers ``/readyz`` before another runs: the checks write to
#: the database and reach the broker, and the port may face any client, so their rate is bounded
#: whatever the rate of requests (at most one check per this interval plus the check's own time).
READY_CHECK_INTERVAL_SECONDS = 1.0
#: Most connections served at once: each holds a file descriptor and up to a 64 KiB buffer.
MAX_CONNECTIONS = 64
#: How long a client has to send its request line and headers (a probe sends them at once).
REQUEST_TIMEOUT_SECONDS = 5.0
#: How long answering may take once the request is in: the readiness checks, then the write.
ANSWER_TIMEOUT_SECONDS = 2 * READY_CHECK_TIMEOUT_SECONDS
#: The most bytes of request line and headers read from one request.
MAX_REQUEST_BYTES = 64 * 1024
#: Past the cap, with every connection being answered: how long a new one may take to send its request.
OVER_CAP_REQUEST_SECONDS = 1.0
#: How long closing may wait for the answer to leave, for a client that does not read it.
CLOSE_TIMEOUT_SECONDS = 1.0
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def request_is_head(request: bytes) -> bool:
    """Whether the request line asks for the headers only (HEAD: the same answer, no body)."""
    return request.startswith(b"HEAD ")


class HealthServer:
    """Serves the relay's metrics and probes; one request per connection."""

    def __init__(
        self,
        relay: Relay,
        host: str,
        port: int,
        *,
        stopping: asyncio.Event | None = None,
        check_interval_seconds: float = READY_CHECK_INTERVAL_SECONDS,
    ) -> None:
        """``stopping``: once set (SIGTERM), the relay is draining and ``/readyz`` answers 503.
        ``check_interval_seconds``: how long a finished check's result is reused."""
        self.relay = relay
        self.check_interval_seconds = check_interval_seconds
        self.host = host
        self.port = port
        self.stopping = stopping or asyncio.Event()
        self._server: asyncio.Server | None = None
        # The open connections, oldest first; True while still waiting for the request.
        self._connections: dict[asyncio.StreamWriter, bool] = {}
        self._handlers: set[asyncio.Task[object]] = set()
        self._closing = False
        #: Set once the relay has connected: until then it is not ready, and a
        #: probe must not open connections that start-up would not close.
        self.started = False
        self._checks: asyncio.Task[str | None] | None = None
        self._reported: asyncio.Task[str | None] | None = None
        #: When the last checks finished (the loop's clock).
        self._checked_at = -float("inf")
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
        """Stop listening, and end the connections still open (a client waiting for nothing gets nothing)."""
        if self._server is not None:
            self._server.close()
            self._closing = True
            for task in self._handlers:
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    def alive(self) -> bool:
        """True unless the relay loop is wedged (see :meth:`relay.loop.Relay.alive`)."""
        return self.relay.alive()

    async def ready(self) -> bool:
        """True when the database and the broker answer; with routes, every route's broker.

        A routed sink that is down holds back its events while the others flow:
        the relay is working, but not for everything, so it is not ready. Nor
        is a relay that is stopping (draining the batches in hand).

        The checks run as one task that probes share and that a probe never
        cancels: a probe answers "not ready" once they take longer than
        ``READY_CHECK_TIMEOUT_SECONDS``, and the next probes wait on the same
        checks. Cancelled, a check on a database that stopped answering would
        take psycopg's cancellation (several seconds more, and the relay's
        connection closed) before any answer went out. A finished check answers
        the probes of the next ``check_interval_seconds``: each check runs an
        UPDATE and reaches the broker, and 20 clients asking without a pause
        drove hundreds a second.
        """
        if not self.started:
            return False
        if self.stopping.is_set():
            # Draining: load balancers and orchestrators must stop counting on this relay.
            logger.info("not ready: stopping", extra={"action": "not_ready"})
            return False
        loop = asyncio.get_running_loop()
        if self._checks is None or (
            self._checks.done() and loop.time() - self._checked_at >= self.check_interval_seconds
        ):
            self._checks = asyncio.create_task(self._check(), name="readiness checks")
            # Retrieve the outcome even when no probe waits for it any more.
            self._checks.add_done_callback(lambda task: task.cancelled() or task.exception())
        # This probe's checks: by the time it resumes, a later probe may have started the next ones.
        checks = self._checks
        done, _ = await asyncio.wait({checks}, timeout=READY_CHECK_TIMEOUT_SECONDS)
        if not done:
            logger.info(
                "not ready: %s did not answer within %g s",
                self._checking,
                READY_CHECK_TIMEOUT_SECONDS,
                extra={"action": "not_ready"},
            )
            return False
        problem = checks.result()
        if problem is not None and self._reported is not checks:
            self._reported = checks  # once per check, not once per probe that reuses it
            logger.info("not ready: %s", problem, extra={"action": "not_ready"})
        return problem is None

    async def _check(self) -> str | None:
        """What keeps the relay from being ready, or None."""
        try:
            return await self._checks_once()
        finally:
            self._checked_at = asyncio.get_running_loop().time()

    async def _checks_once(self) -> str | None:
        sink = self.relay.sink
        try:
            self._checking = "the database"
            await self.relay.source.check()
            self._checking = "the broker" if not isinstance(sink, RoutingSink) else "a routed broker"
            await sink.check()
        except RelayError as exc:
            return str(exc) or type(exc).__name__
        if isinstance(sink, RoutingSink) and sink.down():
            return "sinks down (" + "; ".join(f"{label}: {error}" for label, error in sink.down().items()) + ")"
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:  # accepted just before close(), which could not cancel what had not started
            writer.transport.abort()
            return
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        try:
            if len(self._connections) >= MAX_CONNECTIONS and not self._evict_idle():
                await self._over_cap(reader, writer)
                return
            self._connections[writer] = True
            try:
                async with asyncio.timeout(REQUEST_TIMEOUT_SECONDS) as deadline:
                    await self._serve(reader, writer, deadline)
            except TimeoutError:
                waiting = self._connections.get(writer)  # None: evicted, and told so
                if waiting:
                    self._say_timeout(writer)
                elif waiting is False:  # a client that does not read its answer: drop what is left of it
                    writer.transport.abort()
            finally:
                self._connections.pop(writer, None)
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            if not self._closing:
                raise
            # Ended by close(): a cancelled handler would be reported as an error by asyncio's streams.
            writer.transport.abort()
        finally:
            self._handlers.discard(handler)
            writer.close()
            try:
                # Closing waits for the answer to go out; a client that never reads it must not hold the socket.
                async with asyncio.timeout(CLOSE_TIMEOUT_SECONDS):
                    await writer.wait_closed()
            except TimeoutError:
                writer.transport.abort()
            except ConnectionError:
                pass

    @staticmethod
    def _say_timeout(writer: asyncio.StreamWriter) -> None:
        writer.write(_response("408 Request Timeout", "text/plain", "", b"request timeout\n"))

    def _evict_idle(self) -> bool:
        """Make room: close the oldest connection still waiting for its request. False if there is none."""
        for writer, waiting in self._connections.items():
            if waiting:
                # Out of the table at once: its handler sees that, and answers nothing more.
                del self._connections[writer]
                self._say_timeout(writer)
                writer.close()
                # DEBUG: a flood of connections must not become a flood of log lines.
                logger.debug(
                    "metrics server at %d connections: closed the oldest one still waiting for its request",
                    MAX_CONNECTIONS,
                    extra={"action": "metrics_evict"},
                )
                return True
        return False

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, deadline: asyncio.Timeout
    ) -> None:
        """Read one request within the deadline, then answer it within ``ANSWER_TIMEOUT_SECONDS``."""
        request = b""
        answer: tuple[str, str, str, bytes] | None = None
        try:
            request = await _read_request(reader)
        except ValueError:  # a line past the reader's limit (64 KiB), or all of them past MAX_REQUEST_BYTES
            answer = ("431 Request Header Fields Too Large", "text/plain", "", b"request too large\n")
        if writer not in self._connections:
            return  # evicted meanwhile: it has its answer
        if deadline.expired():
            await asyncio.sleep(0)  # the deadline's cancellation is pending: take it (a TimeoutError)
        # The request is in: no longer idle, and the answer gets its own time.
        self._connections[writer] = False
        deadline.reschedule(asyncio.get_running_loop().time() + ANSWER_TIMEOUT_SECONDS)
        status, ctype, extra, body = answer or await self._answer(request)
        writer.write(_response(status, ctype, extra, body, head=request_is_head(request)))
        await writer.drain()

    async def _over_cap(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Every connection is being answered (each within ANSWER_TIMEOUT_SECONDS): this one gets
        ``OVER_CAP_REQUEST_SECONDS`` for its request. ``/healthz``, answered from memory, is answered
        as ever: a liveness probe must not restart a relay whose other probes or scrapes are slow (a
        database that stalls holds every ``/readyz`` for seconds). Anything else gets 503."""
        request = b""
        with contextlib.suppress(TimeoutError, ValueError):
            async with asyncio.timeout(OVER_CAP_REQUEST_SECONDS):
                # The whole request is read: a socket closed with bytes unread is reset, and the
                # client may lose the answer.
                request = await _read_request(reader)
        parts = request.decode("latin-1").split()
        if len(parts) == 3 and parts[0] in ("GET", "HEAD") and parts[1].split("?")[0] == "/healthz":
            status, ctype, extra, body = await self._answer(request)
        else:
            status, ctype, extra, body = "503 Service Unavailable", "text/plain", "Retry-After: 1\r\n", b"busy\n"
        writer.write(_response(status, ctype, extra, body, head=request_is_head(request)))

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


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """The request line, once its header lines are read (and dropped); ValueError past ``MAX_REQUEST_BYTES``
    (or a line past the reader's own limit, 64 KiB)."""
    request = await reader.readline()
    size = len(request)
    while (line := await reader.readline()).strip() and size <= MAX_REQUEST_BYTES:
        size += len(line)
    if size > MAX_REQUEST_BYTES:
        raise ValueError(size)
    return request


def _response(status: str, ctype: str, extra: str, body: bytes, *, head: bool = False) -> bytes:
    """One HTTP/1.1 answer that closes the connection; ``extra``: header lines, each ending in CRLF.

    ``head``: the headers only, with the length of the body a GET would get.
    """
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n".encode()
        + (b"" if head else body)
    )
