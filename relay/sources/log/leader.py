"""The slot's reader in the background: leadership, the stream, the confirm, the slot's health.

One reader per slot: a relay first takes the slot's lock (a session advisory
lock, :class:`relay.sources.log.slot.TableLink`); the others wait for it and
take over within seconds of the leader's end. The leader then:

- reads the stream while the window has room, turning each outbox row and
  ``outbox`` message into an event of its :class:`.queue.Reading`, in commit
  order (the log source hands them out, :mod:`relay.sources.log.source`);
- confirms, at most every ``CONFIRM_INTERVAL_SECONDS`` and off the delivery
  path, the end of the last transaction all of whose events, and all before
  it, are done (:class:`.window.Window`), checked to still be the leader's just
  before it is sent (fencing), after deleting the acknowledged rows;
- writes heartbeats on an idle database, watches the slot (lag, ``wal_status``,
  gone), and delivers what was handed over to the table (:mod:`.handover`).

A leadership that ends (the lock lost, the stream or the database gone, a write
of the source's failed) drops its events: the next one reads again from the
confirmed position (duplicates, never a loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import cast
from uuid import UUID

from relay.backoff import Backoff, OutageBackoff
from relay.config import NATIVE, RelaySettings, TableLayout, TableName
from relay.errors import StoreUnavailable
from relay.metrics import Metrics
from relay.sinks.base import Sink
from relay.sources.log.decode import BadEnvelope, message_event
from relay.sources.log.handover import deliver_handed_over
from relay.sources.log.pgoutput import format_lsn
from relay.sources.log.publication import publication_name
from relay.sources.log.queue import Reading
from relay.sources.log.reader import FrameReader
from relay.sources.log.slot import TableLink
from relay.sources.log.stream import ReplicationStream, SlotBusy, SlotMissing
from relay.sources.log.window import Pending, Window

logger = logging.getLogger(__name__)

#: A leader frozen (or cut off) this long loses the slot: its session, and lock, end; its stream too.
LEADER_TIMEOUT_SECONDS = 10.0
#: How often a standby tries the slot's lock.
STANDBY_POLL_SECONDS = 1.0
#: A leader whose session or stream was lost tries the lock again after this long at the soonest, so that
#: a standby (which tries every ``STANDBY_POLL_SECONDS``) takes over from a leader that is going.
YIELD_SECONDS = 2 * STANDBY_POLL_SECONDS
#: How often the reader tells the server where it is, even with nothing new to confirm.
STATUS_INTERVAL_SECONDS = 2.0
#: Least time between two confirms while events flow (each costs a fencing query).
CONFIRM_INTERVAL_SECONDS = 0.2
#: An idle leader writes a heartbeat this often, so the slot advances past other databases' WAL.
HEARTBEAT_SECONDS = 10.0
#: How often the leader delivers what was handed over to the table (parked events, requeued dead letters).
SWEEP_SECONDS = 1.0
#: How often the slot's lag and ``wal_status`` are read.
OBSERVE_SECONDS = 5.0
#: Events and bytes in flight at most: the reader stops reading while the window is full.
WINDOW_EVENTS_PER_BATCH = 8
WINDOW_BYTES = 64 * 1024 * 1024
CONNECT_TIMEOUT_SECONDS = 10.0


class Fenced(StoreUnavailable):
    """This relay no longer holds the slot's lock: it confirms nothing and starts over as a standby."""


@dataclass(slots=True)
class SlotState:
    """The slot as last seen: for metrics, ``status`` and ``/healthz``."""

    lag_bytes: int | None = None
    wal_status: str | None = None
    lag_seconds: float | None = None
    gone: str | None = None
    leading: bool = False


class _NotLeading(Exception):
    """Another relay holds the slot."""


class Leader:
    """Leads the slot when it can, in a task of its own: reads, confirms, watches. See the module's text."""

    def __init__(
        self,
        dsn: str,
        table: TableName,
        slot: str,
        sink: Sink,
        settings: RelaySettings,
        metrics: Metrics,
        *,
        publish_grace_seconds: float = 0.0,
        leader_timeout_seconds: float = LEADER_TIMEOUT_SECONDS,
        layout: TableLayout = NATIVE,
    ) -> None:
        self.sink = sink
        self.settings = settings
        self.metrics = metrics
        self.table = table
        self.slot = slot
        self.layout = layout
        self._dsn = dsn
        self._leader_timeout = leader_timeout_seconds
        self._grace = publish_grace_seconds
        #: The ordinary connection: the lock, fencing, dead letters (``/readyz`` checks it).
        self.link = TableLink(dsn, table, slot, leader_timeout_seconds=leader_timeout_seconds, layout=layout)
        self.state = SlotState()
        self._backoff = Backoff(settings.backoff_initial_seconds, settings.backoff_max_seconds)
        self._outage = OutageBackoff()
        self.window_events = max(settings.batch_size * WINDOW_EVENTS_PER_BATCH, 1000)
        #: The events of this leadership, while it reads; None on a standby.
        self.reading: Reading | None = None
        #: The last leadership's, while the batches it handed out come back.
        self._ending: Reading | None = None
        self.stream: ReplicationStream | None = None
        #: Set while a leadership reads: a take waits for it.
        self.leading = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._broken: StoreUnavailable | None = None
        self._lost_lead = False
        self._confirmed = 0
        self._last_confirm = 0.0

    def start(self) -> None:
        """Start leading (or waiting to) in the background; once."""
        if self._task is None:
            self._closing.clear()
            self._task = asyncio.create_task(self._run(), name="log-leader")

    def raise_crash(self) -> None:
        """Raise what the background task died of (a bug): the relay stops loudly."""
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

    def broken(self, error: StoreUnavailable) -> None:
        """A write for this leadership failed: it ends, and the next reads again from the confirmed position."""
        self._broken = self._broken or error

    def reading_of(self, token: UUID) -> tuple[Reading, bool] | None:
        """The leadership that handed out batch ``token``, and whether it is the current one."""
        for reading, current in ((self.reading, True), (self._ending, False)):
            if reading is not None and token in reading.taken:
                return reading, current
        return None

    async def close(self) -> None:
        """Confirm what is done, stop reading and leading, disconnect."""
        task, self._task = self._task, None
        if task is not None:
            self._closing.set()
            with contextlib.suppress(Exception):
                await task
        await self.link.close()

    async def _run(self) -> None:
        while not self._closing.is_set():
            try:
                if not self.link.connected:
                    await self.link.connect(CONNECT_TIMEOUT_SECONDS)
                await self._lead()
            except _NotLeading:
                await self._sleep(STANDBY_POLL_SECONDS)
            except SlotMissing as exc:
                self.state.gone = str(exc)
                logger.error(
                    "the slot cannot be read: %s (see docs/log-source.md, 'When the slot is gone')",
                    exc,
                    extra={"action": "slot_gone"},
                )
                await self._sleep(5.0)
            except StoreUnavailable as exc:
                await self.link.close()  # a lock it may still hold goes with its session
                logger.warning("log source: %s", exc, extra={"action": "store_retry"})
                delay = self._outage.next_delay()
                if self._lost_lead:  # a standby that is up takes over first
                    delay, self._lost_lead = max(delay, YIELD_SECONDS), False
                await self._sleep(delay)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    async def _lead(self) -> None:
        """Take the slot's lock (or raise :class:`_NotLeading`), then read and confirm until closed."""
        if not await self.link.try_lead():
            if self.state.leading:
                logger.warning("no longer the slot's reader", extra={"action": "slot_lost"})
            self.state.leading = False
            await self._observe_slot(None)
            raise _NotLeading
        await self._ended()
        reading = Reading(Window(self.window_events, WINDOW_BYTES))
        logger.info("reading slot %s", self.slot, extra={"action": "slot_lead"})
        self.state.leading = True
        self._broken = None
        await self._observe_slot(reading)
        if self.state.gone is not None:
            raise SlotMissing(self.state.gone)
        frames = FrameReader(
            reading.window, reading.ready, self.table, self.layout,
            batch_size=self.settings.batch_size, more=reading.more, message_event=self._message(reading),
        )  # fmt: skip
        try:
            self.stream = await self._start_stream()
            reading.parked = await self.link.parked_keys()
            self._outage.reset()
            self._confirmed, self._last_confirm = 0, 0.0
            reader = asyncio.create_task(self._read(reading, frames, self.stream), name="log-reader")
            self.reading = reading
            self.leading.set()
            try:
                await self._watch(reading, frames, reader)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
        finally:
            self.leading.clear()
            self._lost_lead = self.reading is reading
            if self.reading is reading:
                self.reading, self._ending = None, reading
            if self.stream is not None:
                await self.stream.close()
                self.stream = None
            self.state.leading = False

    async def _ended(self) -> None:
        """Let the batches the last leadership handed out come back first (each within its publish bound):
        a key's events read again must not overtake its events still with the sink."""
        ending = self._ending
        if ending is not None:
            deadline = time.monotonic() + self.settings.publish_timeout_seconds + self._grace + 1.0
            while ending.taken and time.monotonic() < deadline and not self._closing.is_set():
                await asyncio.sleep(0.05)
            self._ending = None

    async def _start_stream(self) -> ReplicationStream:
        """Start streaming; a reader that lost the lock may still hold the slot for a moment: end it."""
        deadline = time.monotonic() + self._leader_timeout + 5.0
        while True:
            stream = ReplicationStream(
                self._dsn, self.slot, publication_name(self.slot), sender_timeout_seconds=self._leader_timeout
            )
            try:
                await stream.start(CONNECT_TIMEOUT_SECONDS)
                return stream
            except SlotBusy:
                if time.monotonic() > deadline or self._closing.is_set():
                    raise
                await self.link.end_stale_reader()
                await self._sleep(0.5)

    async def _observe_slot(self, reading: Reading | None) -> None:
        found = await self.link.slot()
        state = self.state
        if found is None:
            state.lag_bytes = state.wal_status = None
            state.gone = f"slot {self.slot} does not exist (run outbox-relay migrate --source log --slot {self.slot})"
        else:
            state.lag_bytes, state.wal_status, _ = found
            oldest = reading.window.oldest_commit() if reading is not None else None
            state.lag_seconds = max(0.0, time.time() - oldest) if oldest else 0.0
            if state.wal_status == "lost":
                state.gone = f"slot {self.slot} was invalidated (wal_status lost, max_slot_wal_keep_size)"
            else:
                state.gone = None
        self.metrics.observe_slot(state.lag_bytes, state.lag_seconds, state.wal_status)

    async def _read(self, reading: Reading, frames: FrameReader, stream: ReplicationStream) -> None:
        window, room = reading.window, reading.room
        while True:
            if window.full():
                room.clear()
                await room.wait()
                continue
            frames.take(await stream.read_frames(1.0, frames.room()))
            if frames.reply_wanted:
                # The confirms may wait on the table (a writer's row lock, a slow sweep): the stream must not
                # end as silent meanwhile.
                frames.reply_wanted = False
                await stream.answer()

    def _message(self, reading: Reading) -> Callable[[int, bytes, datetime], Pending]:
        def event_of(lsn: int, content: bytes, commit_time: datetime) -> Pending:
            try:
                return cast(Pending, message_event(lsn, content, commit_time, Pending))
            except BadEnvelope as exc:
                # Dead-lettered when taken: an event whose reason is its bad envelope (attempts past the maximum).
                event = Pending(
                    id=lsn, topic="", key=None, payload=content, headers={},
                    idempotency_key=f"pg-message-{format_lsn(lsn)}", attempts=self.settings.max_attempts,
                    created_at=commit_time, content_type="application/octet-stream",
                )  # fmt: skip
                reading.bad[id(event)] = str(exc)
                return event

        return event_of

    async def _watch(self, reading: Reading, frames: FrameReader, reader: asyncio.Task[None]) -> None:
        """Confirm, sweep, watch the slot and beat until closed, the reader fails or a write failed."""
        now = time.monotonic()
        next_heartbeat = now + HEARTBEAT_SECONDS
        next_observe = now + OBSERVE_SECONDS
        next_sweep = 0.0
        # The sweep publishes (up to the publish timeout): beside this loop, whose confirms and status updates
        # keep the lock's session and the stream from ending as idle meanwhile.
        sweeping: asyncio.Task[None] | None = None
        # Set once the leadership ends: a sweep finishes the round it is in, and starts no other.
        ending = asyncio.Event()
        try:
            while not self._closing.is_set():
                if reader.done():
                    reader.result()  # a lost stream ends the leadership
                    return
                if self._broken is not None:
                    raise self._broken
                if sweeping is not None and sweeping.done():
                    done, sweeping = sweeping, None
                    done.result()  # a failed write ends the leadership
                reading.has_room()
                await self._confirm(reading, frames)
                now = time.monotonic()
                if now >= next_sweep and sweeping is None:
                    next_sweep = now + SWEEP_SECONDS
                    sweeping = asyncio.create_task(self._sweep(reading, ending), name="log-sweep")
                if now >= next_observe:
                    next_observe = now + OBSERVE_SECONDS
                    await self._observe_slot(reading)
                if now >= next_heartbeat and reading.window.idle():
                    next_heartbeat = now + HEARTBEAT_SECONDS
                    await self.link.heartbeat()
                await self._sleep(CONFIRM_INTERVAL_SECONDS)
        finally:
            ending.set()
            if sweeping is not None:
                # It ends as it did in line: a sink's publish is not cut off halfway (it ends within the publish
                # timeout), and its settle fails at once if the session is gone.
                await asyncio.gather(sweeping, return_exceptions=True)
        # Closing: the batches in hand were confirmed (the loop drained them first).
        await self._confirm(reading, frames, final=True)

    async def _sweep(self, reading: Reading, ending: asyncio.Event) -> None:
        """Deliver what was handed over to the table and may go now; park exactly the keys it still holds.

        A round sends a batch of them (runs of a key, :meth:`TableLink.handed_over`); the sweep goes round
        again while a round settled any, so that a backlog handed over by migrate (thousands of events, many of
        a key) goes at the pace of the round trips, not a batch a sweep interval."""
        while await deliver_handed_over(self.link, self.sink, self.settings, self._backoff, self.metrics):
            if ending.is_set() or self._closing.is_set():
                break
        reading.newly_parked.clear()
        # A key parked while the table was read stays parked: its dead letter may have come after the read.
        reading.parked = await self.link.parked_keys() | reading.newly_parked
        self.metrics.parked_keys.set(len(reading.parked))

    async def _confirm(self, reading: Reading, frames: FrameReader, *, final: bool = False) -> None:
        """Send the done prefix's end to the server, if it moved (or now and then), once fenced."""
        stream = self.stream
        if stream is None:
            return
        lsn = reading.window.confirmable()
        target = max(self._confirmed, lsn or 0)
        if reading.window.idle() and reading.settled():
            target = max(target, frames.idle_end)
        now = time.monotonic()
        moved = target > self._confirmed
        if not (final or moved or now - stream.last_status_at >= STATUS_INTERVAL_SECONDS):
            return
        rows, reading.delivered_rows = reading.delivered_rows, []
        if not await self.link.fence_and_delete(rows):
            raise Fenced("the slot's lock was lost: confirming nothing")
        await stream.confirm(target, reply=not moved)
        self._last_confirm = now
        if moved:
            self._confirmed = target
            logger.debug("confirmed %s", format_lsn(target), extra={"action": "confirm"})
