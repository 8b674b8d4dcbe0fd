"""One AMQP connection and its confirm-mode channel: opening, closing, losing them.

The link tracks the delivery tags of unconfirmed messages and turns the
broker's acks, nacks and returns, and a lost channel or connection, into
outcomes of the batches they belong to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable

import pika
import pika.exceptions
from pika import spec
from pika.channel import Channel
from pika.connection import Connection
from pika.exchange_type import ExchangeType
from pika.frame import Method

from relay.events import Event, Failure, Outcome
from relay.sinks.formats import AmqpEncoder, amqp_native
from relay.sinks.rabbitmq.batch import Batch
from relay.sinks.rabbitmq.frames import publish_frames
from relay.sinks.rabbitmq.limits import too_large
from relay.sinks.rabbitmq.params import describe, root_cause
from relay.sinks.rabbitmq.transport import CorkedConnection

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_SECONDS = 5.0
#: Reply codes with which RabbitMQ refuses something a client sent on a channel or
#: connection (a method, a frame, a message's content) and closes it. A close with
#: any other code (320 forced by an operator, 404 a deleted exchange) or a lost
#: socket says nothing about the messages in flight.
REFUSAL_CODES = frozenset({403, 406, 501, 502, 503, 505, 530, 540, 541})
_OVERSIZE_RE = re.compile(r"message size (\d+) is larger than configured max size (\d+)")
_ACCESS_REFUSED = 403
_NOT_FOUND = 404
_PRECONDITION_FAILED = 406


class LinkError(Exception):
    """Opening failed; ``refused`` when the broker said no (login, vhost, exchange)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class Link:
    """One AMQP connection and its confirm-mode channel, with the unconfirmed tags."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        exchange: str,
        url: str,
        learn_max_size: Callable[[int], None],
        encode: AmqpEncoder = amqp_native,
        *,
        declare: str | None = None,
    ) -> None:
        self._loop = loop
        self._exchange = exchange
        self._declare = declare
        self._encode = encode
        self._url = url
        self._learn_max_size = learn_max_size
        self._connection: CorkedConnection | None = None
        self.channel: Channel | None = None
        #: The broker's reason while it blocks publishers (memory or disk alarm).
        self.blocked: str | None = None
        self.last_error = "not connected"
        #: Why the broker last closed the channel or connection in refusal, or None.
        self.refusal: str | None = None
        self._closed: asyncio.Future[None] = loop.create_future()
        self._waiter: asyncio.Future[None] | None = None
        # Delivery tags count from 1 on each confirm-mode channel.
        self._next_tag = 1
        self._lowest_tag = 1
        self._pending: dict[int, tuple[Batch, int]] = {}
        self._returned: dict[int, str] = {}
        self._drained = asyncio.Event()
        self._drained.set()

    @property
    def connection_open(self) -> bool:
        return self._connection is not None and self._connection.is_open

    @property
    def usable(self) -> bool:
        return self.connection_open and self.channel is not None and self.channel.is_open

    def publish(self, channel: Channel, event: Event) -> None:
        """Send ``event`` as a persistent, mandatory message on ``channel`` (what
        ``channel.basic_publish`` sends, packed by :func:`publish_frames`)."""
        connection = self._connection
        if connection is None or connection.is_closed or connection.params is None:
            raise pika.exceptions.ConnectionWrongStateError("the connection is closed")
        if not channel.is_open:
            raise pika.exceptions.ChannelWrongStateError("the channel is closed")
        # What pika splits bodies by: the negotiated frame size less a frame's header and end.
        body_max = connection.params.frame_max - spec.FRAME_HEADER_SIZE - spec.FRAME_END_SIZE
        connection.send_frames(publish_frames(channel.channel_number, self._exchange, event, body_max, self._encode))

    def corked(self) -> contextlib.AbstractContextManager[None]:
        """Write what is published inside the block in one go (see :class:`CorkedConnection`)."""
        return self._connection.corked() if self._connection is not None else contextlib.nullcontext()

    async def open(self, params: pika.URLParameters) -> None:
        self._waiter = self._loop.create_future()
        self._connection = CorkedConnection(
            params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_connection_closed,
            custom_ioloop=self._loop,
        )
        await self._waiter

    async def open_channel(self) -> None:
        assert self._connection is not None
        self._waiter = self._loop.create_future()
        self._connection.channel(on_open_callback=self._on_channel_open)
        await self._waiter

    def track(self, batch: Batch, index: int) -> None:
        """Expect a confirm for event ``index`` of ``batch``, sent just now."""
        self._pending[self._next_tag] = (batch, index)
        self._next_tag += 1
        self._drained.clear()

    def forget(self, batch: Batch) -> None:
        """Ignore confirms still to come for ``batch``."""
        for tag in [tag for tag, (owner, _) in self._pending.items() if owner is batch]:
            del self._pending[tag]
            self._returned.pop(tag, None)
        self._check_drained()

    async def drained(self) -> None:
        """Return once no message sent on this link waits for its confirm."""
        await self._drained.wait()

    def _check_drained(self) -> None:
        if not self._pending:
            self._drained.set()

    async def close(self, *, graceful: bool = True) -> None:
        """Close the connection; abort it if the broker does not answer in time."""
        connection = self._connection
        if connection is None or self._closed.done():
            return
        if graceful and not (connection.is_closing or connection.is_closed):
            connection.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._closed), CLOSE_TIMEOUT_SECONDS)
        if not self._closed.done():
            # pika has no public close that skips the Close-Ok handshake; this is
            # what its own heartbeat and blocked-connection timeouts call.
            connection._terminate_stream(  # type: ignore[attr-defined]
                pika.exceptions.ConnectionClosedByClient(200, "abandoned an unresponsive connection")
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._closed), CLOSE_TIMEOUT_SECONDS)
        if not self._closed.done():
            logger.warning("RabbitMQ connection did not close", extra={"action": "rabbitmq.close_timeout"})

    def _settle(self, error: Exception | None) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _on_open(self, connection: Connection) -> None:
        connection.add_on_connection_blocked_callback(self._on_blocked)
        connection.add_on_connection_unblocked_callback(self._on_unblocked)
        connection.channel(on_open_callback=self._on_channel_open)

    def _on_open_error(self, connection: Connection, error: str | BaseException) -> None:
        self.last_error = describe(error)
        root = root_cause(error)
        if isinstance(root, pika.exceptions.AuthenticationError | pika.exceptions.ProbableAuthenticationError):
            failure = LinkError(
                f"RabbitMQ at {self._url} refused the login: check the user and password in the sink URL "
                f"({self.last_error})",
                refused=True,
            )
        elif isinstance(root, pika.exceptions.ProbableAccessDeniedError):
            failure = LinkError(
                f"RabbitMQ at {self._url} refused access to the vhost: it does not exist or the user "
                f"has no permission on it ({self.last_error})",
                refused=True,
            )
        else:
            failure = LinkError(self.last_error)
        self._settle(failure)
        if not self._closed.done():
            self._closed.set_result(None)

    def _on_connection_closed(self, connection: Connection, error: BaseException) -> None:
        self.last_error = f"connection closed: {describe(error)}"
        self.channel = None
        refused = _is_refusal(error)
        if refused:
            self.refusal = self.last_error
        self._fail_pending(self.last_error, refused=refused)
        self._settle(LinkError(self.last_error))
        if not self._closed.done():
            self._closed.set_result(None)
        if not isinstance(error, pika.exceptions.ConnectionClosedByClient):
            logger.warning(
                "lost the RabbitMQ connection: %s",
                self.last_error,
                extra={"action": "rabbitmq.connection_lost"},
            )

    def _on_blocked(self, connection: Connection, frame: Method[spec.Connection.Blocked]) -> None:
        self.blocked = str(getattr(frame.method, "reason", "") or "resource alarm")
        logger.warning("RabbitMQ blocks publishing: %s", self.blocked, extra={"action": "rabbitmq.blocked"})

    def _on_unblocked(self, connection: Connection, frame: Method[spec.Connection.Unblocked]) -> None:
        self.blocked = None
        logger.info("RabbitMQ accepts publishing again", extra={"action": "rabbitmq.unblocked"})

    def _on_channel_open(self, channel: Channel) -> None:
        self.channel = channel
        self.refusal = None
        self._next_tag = self._lowest_tag = 1
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        if self._exchange and self._declare:
            # declare=TYPE: created if missing; 406 if it exists with another type or durability.
            channel.exchange_declare(
                self._exchange,
                exchange_type=ExchangeType(self._declare),
                durable=True,
                callback=lambda _: self._confirm(channel),
            )
        elif self._exchange:
            # Passive: fails (404) unless the exchange exists, creates nothing.
            channel.exchange_declare(self._exchange, passive=True, callback=lambda _: self._confirm(channel))
        else:
            self._confirm(channel)

    def _confirm(self, channel: Channel) -> None:
        channel.confirm_delivery(self._on_confirm, callback=lambda _: self._settle(None))

    def _on_channel_closed(self, channel: Channel, error: BaseException) -> None:
        if channel is not self.channel:
            return
        self.channel = None
        code = error.reply_code if isinstance(error, pika.exceptions.ChannelClosed) else 0
        text = error.reply_text if isinstance(error, pika.exceptions.ChannelClosed) else describe(error)
        self.last_error = f"channel closed by the broker: {code} {text}" if code else f"channel closed: {text}"
        oversize = _OVERSIZE_RE.search(text) if code == 406 else None
        if oversize:
            size, max_bytes = int(oversize.group(1)), int(oversize.group(2))
            self._learn_max_size(max_bytes)
            for tag, (batch, index) in list(self._pending.items()):
                if self._body_is(batch.events[index], size):
                    del self._pending[tag]
                    batch.resolve(index, Failure(too_large(size, max_bytes), permanent=True), settled=True)
        # The connection's refusal reaches its channels first.
        refusing = _is_refusal(error)
        if refusing:
            self.refusal = self.last_error
        self._fail_pending(self.last_error, refused=refusing)
        if self._waiter is not None:
            refused = code in (_ACCESS_REFUSED, _NOT_FOUND) or (code == _PRECONDITION_FAILED and bool(self._declare))
            if code == _NOT_FOUND and self._exchange:
                message = (
                    f"exchange {self._exchange!r} does not exist at {self._url} ({text}): declare it, or add"
                    " declare=topic (or direct, fanout, headers) to the sink URL to have the relay declare it"
                )
            elif code == _PRECONDITION_FAILED and self._declare:
                message = (
                    f"exchange {self._exchange!r} at {self._url} exists, but not as a durable {self._declare}"
                    f" exchange as declare={self._declare} asks ({text})"
                )
            else:
                message = f"RabbitMQ at {self._url} refused the channel: {code} {text}"
            self._settle(LinkError(message, refused=refused))
        elif isinstance(error, pika.exceptions.ChannelClosedByBroker):
            # Connection-level losses are logged once, by the connection callback.
            logger.warning("%s", self.last_error, extra={"action": "rabbitmq.channel_closed"})

    def _body_is(self, event: Event, size: int) -> bool:
        """Whether ``event``'s body, in the sink's format, is ``size`` bytes (the size a 406 names)."""
        if len(event.payload) > size:
            return False  # a body is never smaller than its payload
        return len(event.payload) == size or len(self._encode(event)[0]) == size

    def _fail_pending(self, error: str, *, refused: bool) -> None:
        """Every message awaiting a confirm is lost with the channel; after a
        refusal each is a suspect, sent again to find the one refused."""
        pending, self._pending = self._pending, {}
        self._returned.clear()
        self._check_drained()
        for batch, index in pending.values():
            if refused:
                batch.suspect([index], f"unconfirmed, {error}")
            else:
                # Not the event's fault (the broker may even have it): given back without an attempt spent.
                batch.resolve(index, Failure(f"unconfirmed, {error}", unavailable=True), settled=False)

    def _on_return(
        self, channel: Channel, method: spec.Basic.Return, properties: spec.BasicProperties, body: bytes
    ) -> None:
        # basic.return carries no delivery tag, only our message_id; it comes
        # before the ack of the same message, so the earliest unreturned
        # pending message with that id is the one.
        for tag, (batch, index) in self._pending.items():
            event = batch.events[index]
            if event.idempotency_key == properties.message_id and tag not in self._returned:
                self._returned[tag] = (
                    f"unroutable: no queue bound for routing key {method.routing_key!r} on exchange "
                    f"{method.exchange!r} ({method.reply_code} {method.reply_text})"
                )
                logger.debug(
                    "event %d is unroutable",
                    event.id,
                    extra={"action": "rabbitmq.unroutable", "event_id": event.id, "topic": event.topic},
                )
                return

    def _on_confirm(self, frame: Method[spec.Basic.Ack | spec.Basic.Nack]) -> None:
        method = frame.method
        acked = isinstance(method, spec.Basic.Ack)
        tag = method.delivery_tag
        tags = range(self._lowest_tag, tag + 1) if method.multiple else (tag,)
        for confirmed in tags:
            slot = self._pending.pop(confirmed, None)
            if slot is None:
                continue
            batch, index = slot
            returned = self._returned.pop(confirmed, None)
            if not acked:
                outcome: Outcome = Failure("the broker nacked the message (internal error or queue limit)")
            elif returned is not None:
                outcome = Failure(returned)
            else:
                outcome = None
            batch.resolve(index, outcome, settled=True)
        if method.multiple:
            self._lowest_tag = max(self._lowest_tag, tag + 1)
        self._check_drained()


def _is_refusal(error: BaseException) -> bool:
    """Whether the broker closed the channel or connection in refusal of something sent on it."""
    by_broker = pika.exceptions.ChannelClosedByBroker | pika.exceptions.ConnectionClosedByBroker
    return isinstance(error, by_broker) and error.reply_code in REFUSAL_CODES
