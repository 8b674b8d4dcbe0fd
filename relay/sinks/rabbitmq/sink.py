"""The RabbitMQ sink: publisher confirms on one pika channel, on the relay's event loop.

A batch is written to a confirm-mode channel without waiting between messages,
except that a key's next event waits for the confirm of the one before it (see
:mod:`.batch`); the broker's acks (often ``multiple=True``) are matched to
events by delivery tag, and a ``basic.return`` (mandatory, no queue bound)
turns the ack that follows it into a failure. pika's ``AsyncioConnection`` runs on the running
loop rather than a connection in a thread: both reach the broker's rate here,
and the loop version needs no cross-thread hand-off or locking.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from relay.config import CONNECT_TIMEOUT_SECONDS, AmqpSinkConfig, Format
from relay.errors import ConfigError, SinkError, SinkTimeout, SinkUnavailable
from relay.events import Event, Failure, Outcome
from relay.holds import KeyHolds
from relay.secrets import Scrubber, redact_url
from relay.sinks.base import scrubbed
from relay.sinks.formats import DEFAULT_EVENT_SOURCE, amqp_encoder, refusal_of
from relay.sinks.keyorder import KeyOrder
from relay.sinks.rabbitmq.batch import Batch
from relay.sinks.rabbitmq.handoff import hand_off
from relay.sinks.rabbitmq.limits import refusal
from relay.sinks.rabbitmq.link import CLOSE_TIMEOUT_SECONDS, Link, LinkError
from relay.sinks.rabbitmq.params import connection_parameters

logger = logging.getLogger(__name__)

#: At most how many times its payload a CloudEvents body is, plus its attributes' bytes:
#: a text payload becomes a JSON string, whose escapes (\u0000) take six bytes a byte.
ENVELOPE_GROWTH_MAX = 6
ENVELOPE_BYTES_MAX = 64 * 1024
#: RabbitMQ 3.x's default ``max_message_size``; a larger body closes the channel.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
HEARTBEAT_SECONDS = 30
RECONNECT_ATTEMPTS = 3
RECONNECT_BACKOFF_INITIAL_SECONDS = 0.2
RECONNECT_BACKOFF_MAX_SECONDS = 2.0


class RabbitMQSink:
    """Publishes to an exchange with publisher confirms and ``mandatory`` set.

    Not thread-safe: use it from the event loop it was started on. Concurrent
    ``publish`` calls are fine; what is ready of a batch is written contiguously.
    A key has at most one message waiting for its confirm, within a batch and
    across the batches in flight (a batch's first event of a key waits for the
    confirm of the key's last event in the batches before it), so a message
    nacked, returned or refused is never overtaken by a later one of its key;
    its key is held and the rest of its events answered ``HELD``.
    """

    name = "rabbitmq"
    #: A key's next batches may be claimed while its earlier ones are in flight: each waits for the one before.
    chains_keys = True

    def __init__(
        self,
        config: AmqpSinkConfig,
        *,
        publish_timeout_seconds: float,
        connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        heartbeat_seconds: int = HEARTBEAT_SECONDS,
        blocked_connection_timeout_seconds: float | None = None,
        event_source: str = DEFAULT_EVENT_SOURCE,
    ) -> None:
        if publish_timeout_seconds <= 0 or connect_timeout_seconds <= 0 or max_message_bytes < 1:
            raise ConfigError("RabbitMQ sink timeouts and max message size must be positive")
        self._exchange = config.exchange
        self._declare = config.declare
        # The message shape (config.format), chosen once: called per event as it is sent.
        self._encode = amqp_encoder(config.format, event_source)
        self._native = config.format is Format.NATIVE
        self._format_refusal = refusal_of(config.format)
        self._url = redact_url(config.url)
        self._redact = Scrubber.of(config.url)
        self._publish_timeout = publish_timeout_seconds
        self._connect_timeout = connect_timeout_seconds
        self._max_message_bytes = max_message_bytes
        # A connection blocked by a memory or disk alarm for longer than a
        # publish may take is of no use; pika then closes it and we reconnect.
        blocked = blocked_connection_timeout_seconds or publish_timeout_seconds
        self._params = connection_parameters(config.url, connect_timeout_seconds, heartbeat_seconds, blocked)
        self._link: Link | None = None
        self._connect_lock = asyncio.Lock()
        self._send_lock = asyncio.Lock()
        self._inflight: set[Batch] = set()
        #: Per key, the last event handed to a ``publish`` still under way.
        self._keys = KeyOrder()
        self._closed = False

    async def start(self) -> None:
        """Connect; ``SinkError`` if the broker refuses the login, vhost or exchange."""
        if self._closed:
            raise SinkError("the RabbitMQ sink is closed")
        deadline = asyncio.get_running_loop().time() + self._connect_timeout
        await self._connected(deadline, attempts=1, refusal_is_fatal=True)

    async def publish(self, events: Sequence[Event], holds: KeyHolds | None = None) -> list[Outcome]:
        """Publish ``events`` and wait for their confirms (bounded by the publish timeout).

        A key's events go one at a time, each once the one before is confirmed;
        other keys' events, and those without a key, go without waiting (see
        :mod:`.batch`)."""
        batch = Batch(events, asyncio.get_running_loop(), holds)
        # Entered before anything is awaited, so that publish calls chain in the order they were made.
        # Should it raise, nothing of the batch is reported: its keys are held on the way out, before
        # a later batch waiting on one of its events goes on.
        with self._keys.entered(batch.turns):
            batch.after()
            return undecided_failed(batch, await self._publish(batch))

    async def _publish(self, batch: Batch) -> list[Outcome]:
        loop = asyncio.get_running_loop()
        for index, event in enumerate(batch.events):
            refused = refusal(event, self._max_message_bytes, None if self._native else self._body_bytes)
            if refused is None and self._format_refusal is not None:
                refused = self._format_refusal(event)
            if refused is not None:
                batch.refused[index] = refused
        if len(batch.refused) == len(batch.events) and not batch.waiting:
            # Nothing needs the broker: each key's first event is refused, the rest of it held.
            # (A key waiting for an earlier batch takes the way below, which waits for it.)
            await hand_off(None, batch, batch.take_ready())
            return batch.outcomes
        if self._closed:
            raise SinkUnavailable("the RabbitMQ sink is closed")
        deadline = loop.time() + self._publish_timeout
        link = await self._connected(deadline, attempts=RECONNECT_ATTEMPTS, refusal_is_fatal=False)
        if link.blocked is not None:
            raise SinkUnavailable(f"RabbitMQ blocks publishing: {link.blocked}")
        self._inflight.add(batch)
        links = {link}
        timed_out = False
        try:
            async with asyncio.timeout_at(deadline):
                await self._drive(batch, link, links, deadline)
        except TimeoutError:
            timed_out = True
        finally:
            self._inflight.discard(batch)
            # Late confirms for this batch (or any after a cancellation) are ignored.
            for used in (*links, self._link):
                if used is not None:
                    used.forget(batch)
        if timed_out:
            batch.time_out(sorted(batch.sent), f"no publisher confirm within {self._publish_timeout:g}s")
        batch.give_back("not sent again: the broker refused a message of its batch and time ran out finding which")
        batch.abandon(
            f"not published: the publish timeout of {self._publish_timeout:g}s ran out before its turn"
            if timed_out
            else f"not published: the link to RabbitMQ failed before its turn ({link.last_error})"
        )
        if batch.settled == 0 and any(o is not None and not o.held and not o.permanent for o in batch.outcomes):
            # The broker said nothing about any event: the relay releases the
            # batch without spending attempts. After a timeout the broker may
            # have stored the events, so it is told apart: copies cost.
            if timed_out:
                await self._drop(link, graceful=False)
                raise SinkTimeout(f"no publisher confirm from {self._url} within {self._publish_timeout:g}s")
            raise SinkUnavailable(f"lost the channel to {self._url} before any confirm: {link.last_error}")
        return scrubbed(batch.outcomes, self._redact) if self._redact else batch.outcomes

    async def _drive(self, batch: Batch, link: Link, links: set[Link], deadline: float) -> None:
        """Send each event when its turn comes, until every event has an outcome."""
        while True:
            if batch.ready:
                async with self._send_lock:
                    # A key's next event may take a newer channel than the one before
                    # it: that one is confirmed, so nothing of its key can be overtaken.
                    current = self._link if self._link is not None and self._link.usable else link
                    links.add(current)
                    await hand_off(current, batch, batch.take_ready())
            elif batch.sent or batch.waiting:
                await batch.changed()
            elif batch.suspects:
                if not await self._isolate(batch, deadline, links):
                    return
            else:
                return

    async def check(self) -> None:
        """Cheap when connected; otherwise one connection attempt. ``SinkUnavailable`` if down."""
        if self._closed:
            raise SinkUnavailable("the RabbitMQ sink is closed")
        link = self._link
        if link is None or not link.usable:
            deadline = asyncio.get_running_loop().time() + self._connect_timeout
            link = await self._connected(deadline, attempts=1, refusal_is_fatal=False)
        if link.blocked is not None:
            raise SinkUnavailable(f"RabbitMQ blocks publishing: {link.blocked}")

    async def close(self) -> None:
        """Wait briefly for confirms in flight, then disconnect. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        pending = [batch.done for batch in self._inflight]
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_SECONDS)
        async with self._connect_lock:
            link, self._link = self._link, None
        if link is not None:
            await link.close()
        logger.info("closed the RabbitMQ connection", extra={"action": "rabbitmq.close"})

    async def _isolate(self, batch: Batch, deadline: float, links: set[Link]) -> bool:
        """Find the events the broker refused by closing the channel or the connection.

        The events in flight at such a close are suspects: any of them, or none,
        may be the cause. They are sent again in halves, each half alone on the
        channel (the send lock is held until its confirms are in, after the
        confirms of other batches), so a close during a half is that half's
        doing. A half of one that is refused again is the culprit: it fails, and
        the failure counts as an attempt, so a poison event ends dead-lettered
        while the events around it are delivered.

        A suspect's key waits for the verdict: cleared and confirmed, its next
        event is ready; convicted, the key stops. False if the search was cut
        short (the suspects left go back untried).
        """
        groups = [sorted(batch.suspects)]
        while groups:
            group = groups.pop(0)
            try:
                link = await self._connected(deadline, attempts=RECONNECT_ATTEMPTS, refusal_is_fatal=False)
            except SinkUnavailable:
                return False
            links.add(link)
            async with self._send_lock:
                await link.drained()
                if not link.usable:
                    # Another batch's message closed the channel while this group waited: the group was not
                    # sent, and a refusal now would not be its doing. It goes again, on a fresh channel.
                    groups.insert(0, group)
                    continue
                batch.retry(group)
                await hand_off(link, batch, group)
                await batch.resolved(group)
            lost = [i for i in group if i not in batch.settled_indices and i not in batch.suspects]
            if lost:
                # The link failed for another reason than a refusal: stop looking.
                batch.suspect_again(lost)
                return False
            refused = [i for i in group if i in batch.suspects]
            if len(refused) == 1 and len(group) == 1:
                self._convict(batch, refused[0], link.refusal or link.last_error)
            elif refused:
                half = (len(refused) + 1) // 2
                groups[:0] = [part for part in (refused[:half], refused[half:]) if part]
        return True

    def _convict(self, batch: Batch, index: int, reason: str) -> None:
        event = batch.events[index]
        batch.convict(index, Failure(f"refused by RabbitMQ: {reason}"))
        logger.warning(
            "RabbitMQ refused event %d: %s",
            event.id,
            reason,
            extra={"action": "rabbitmq.refused", "event_id": event.id, "topic": event.topic},
        )

    async def _connected(self, deadline: float, *, attempts: int, refusal_is_fatal: bool) -> Link:
        """The open link, reconnecting with backoff until ``deadline`` if needed."""
        link = self._link
        if link is not None and link.usable:
            return link
        try:
            async with asyncio.timeout_at(deadline):
                await self._connect_lock.acquire()
        except TimeoutError:
            raise SinkUnavailable(f"cannot reach RabbitMQ at {self._url}: still connecting") from None
        try:
            return await self._reconnect(deadline, attempts, refusal_is_fatal)
        finally:
            self._connect_lock.release()

    async def _reconnect(self, deadline: float, attempts: int, refusal_is_fatal: bool) -> Link:
        loop = asyncio.get_running_loop()
        link = self._link
        if link is not None and link.usable:
            return link
        if link is not None and link.connection_open:
            try:
                async with asyncio.timeout_at(deadline):
                    await link.open_channel()
                return link
            except (LinkError, TimeoutError) as exc:
                logger.warning(
                    "cannot reopen the RabbitMQ channel: %s",
                    exc,
                    extra={"action": "rabbitmq.channel_retry"},
                )
        if link is not None:
            self._link = None
            await link.close()
        delay = RECONNECT_BACKOFF_INITIAL_SECONDS
        problem = "no time left to connect"
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
                delay = min(delay * 2, RECONNECT_BACKOFF_MAX_SECONDS)
            if loop.time() >= deadline:
                break
            link = Link(loop, self._exchange, self._url, self._learn_max_size, self._encode, declare=self._declare)
            try:
                async with asyncio.timeout_at(min(deadline, loop.time() + self._connect_timeout)):
                    await link.open(self._params)
            except LinkError as exc:
                await link.close()
                if exc.refused:
                    if refusal_is_fatal:
                        raise SinkError(str(exc)) from None
                    raise SinkUnavailable(str(exc)) from None
                problem = str(exc)
            except TimeoutError:
                await link.close()
                problem = "timed out connecting"
            except BaseException:
                await link.close()
                raise
            else:
                if self._closed:
                    await link.close()
                    raise SinkUnavailable("the RabbitMQ sink is closed")
                self._link = link
                logger.info("connected to %s", self._url, extra={"action": "rabbitmq.connect"})
                return link
            logger.info(
                "cannot reach RabbitMQ at %s: %s",
                self._url,
                problem,
                extra={"action": "rabbitmq.connect_retry", "attempt": attempt + 1},
            )
        raise SinkUnavailable(f"cannot reach RabbitMQ at {self._url}: {problem}")

    async def _drop(self, link: Link, *, graceful: bool) -> None:
        async with self._connect_lock:
            if self._link is link:
                self._link = None
        await link.close(graceful=graceful)

    def _body_bytes(self, event: Event) -> int:
        """The size of ``event``'s body in the sink's format; encoded only when it could pass the limit
        (an envelope adds its attributes, and base64 a third, or escaping up to six times, to a payload)."""
        if len(event.payload) * ENVELOPE_GROWTH_MAX + ENVELOPE_BYTES_MAX <= self._max_message_bytes:
            return len(event.payload)
        return len(self._encode(event)[0])

    def _learn_max_size(self, max_bytes: int) -> None:
        # The broker's limit is lower than configured: check against it up
        # front from now on, so one large event does not close the channel again.
        if max_bytes < self._max_message_bytes:
            self._max_message_bytes = max_bytes
            logger.warning(
                "RabbitMQ's max message size is %d bytes; checking payloads against it",
                max_bytes,
                extra={"action": "rabbitmq.max_size"},
            )


#: What an event gets that the batch ended without deciding (a bug): not acknowledged, so kept.
UNDECIDED = Failure("rabbitmq: the batch ended without an outcome for this event", timed_out=True)


def undecided_failed(batch: Batch, outcomes: list[Outcome]) -> list[Outcome]:
    """``outcomes``, with a failure for each event the batch has not decided (and its key held).

    An outcome of None means "the broker confirmed it", and the relay then
    deletes the event: a path that returned early, leaving an event without
    its confirm, must keep it in the outbox instead. Every path decides every
    event today; this makes a future one that does not a retry, not a loss.
    """
    left = batch.unresolved | batch.suspects
    if not left:
        return outcomes
    logger.error(
        "rabbitmq: %d of %d events ended their batch undecided; they stay in the outbox",
        len(left),
        len(outcomes),
        extra={"action": "rabbitmq_undecided", "batch_size": len(outcomes)},
    )
    batch.turns.end()  # their keys held; a later batch waiting for one of them goes on, to HELD
    return [UNDECIDED if i in left else outcome for i, outcome in enumerate(outcomes)]
