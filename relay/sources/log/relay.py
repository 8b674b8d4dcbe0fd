"""The log relay: read the slot, publish, confirm the acknowledged prefix.

One reader per slot: a relay first takes the slot's lock (a session advisory
lock, :class:`relay.sources.log.slot.TableLink`); the others wait for it and
take over within seconds of the leader's end. Then:

- the reader reads the stream while the window has room, turning each outbox
  row and ``outbox`` message into an event, in commit order;
- the deliverer publishes them in batches through the sink
  (:class:`.batches.Batches` owns each event's life there), judges the
  outcomes as the table relay does (:func:`relay.batch.costs.judge`), retries a
  failing event in memory with the same backoff (its key's later events wait
  behind it, other keys go on), and dead-letters it into the outbox table when
  its attempts run out or the broker refuses it for good. Its key is then
  parked: its later events are written to the table behind it (``pending``,
  ``last_error`` saying why), where ``dead``, ``requeue`` and ``skip`` see them;
- the position confirmed to the server is the end of the last transaction all
  of whose events, and all before it, are done (:class:`.window.Window`),
  checked to still be the leader's just before it is sent (fencing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from relay.backoff import Backoff, OutageBackoff, sleep_unless_stopped
from relay.config import NATIVE, RelaySettings, TableLayout, TableName
from relay.errors import SinkUnavailable, StoreUnavailable
from relay.events import Event
from relay.metrics import Metrics
from relay.sinks.base import Sink
from relay.sources.log import pgoutput
from relay.sources.log.batches import Batches
from relay.sources.log.decode import BadEnvelope, message_event
from relay.sources.log.pgoutput import format_lsn
from relay.sources.log.reader import FrameReader
from relay.sources.log.slot import TableLink, publication_name
from relay.sources.log.stream import ReplicationStream, SlotBusy, SlotMissing
from relay.sources.log.window import Window

logger = logging.getLogger(__name__)

#: A leader frozen (or cut off) this long loses the slot: its session, and lock, end; its stream too.
LEADER_TIMEOUT_SECONDS = 10.0
#: How often a standby tries the slot's lock.
STANDBY_POLL_SECONDS = 1.0
#: How often the reader tells the server where it is, even with nothing new to confirm.
STATUS_INTERVAL_SECONDS = 2.0
#: Least time between two confirms while events flow (each costs a fencing query).
CONFIRM_INTERVAL_SECONDS = 0.2
#: An idle leader writes a heartbeat this often, so the slot advances past other databases' WAL.
HEARTBEAT_SECONDS = 10.0
#: How often the leader delivers what was handed over to the table (parked events, requeued dead letters).
SWEEP_SECONDS = 1.0
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


class LogRelay:
    """Moves events from a logical replication slot to a sink until stopped."""

    def __init__(
        self,
        dsn: str,
        table: TableName,
        slot: str,
        sink: Sink,
        settings: RelaySettings,
        *,
        metrics: Metrics | None = None,
        publish_grace_seconds: float = 0.0,
        leader_timeout_seconds: float = LEADER_TIMEOUT_SECONDS,
        layout: TableLayout = NATIVE,
    ) -> None:
        self.sink = sink
        self.layout = layout
        self.settings = settings
        self.table = table
        self.slot = slot
        self.metrics = metrics or Metrics()
        self._dsn = dsn
        self._leader_timeout = leader_timeout_seconds
        self._grace = publish_grace_seconds
        #: The ordinary connection: the lock, fencing, dead letters (``/readyz`` checks it as the store).
        self.store = TableLink(dsn, table, slot, leader_timeout_seconds=leader_timeout_seconds, layout=layout)
        self.state = SlotState()
        self._backoff = Backoff(settings.backoff_initial_seconds, settings.backoff_max_seconds)
        self._outage = OutageBackoff()
        self._sink_outage = OutageBackoff()
        self._timeouts = OutageBackoff()
        self.heartbeat = time.monotonic()
        self._opened = False
        # Batches in flight at once: on a sink that keeps a key's order across them, as the table relay.
        self._depth = max(1, settings.pipeline_depth) if sink.chains_keys else 1
        self._reset()

    def _reset(self) -> None:
        settings = self.settings
        self._window = Window(max(settings.batch_size * WINDOW_EVENTS_PER_BATCH, 1000), WINDOW_BYTES)
        self._batches = Batches(
            self._window, self.sink, self.store, settings, self.metrics,
            backoff=self._backoff, timeouts=self._timeouts, sink_outage=self._sink_outage, depth=self._depth,
        )  # fmt: skip
        self._room = asyncio.Event()
        self._more = asyncio.Event()
        self._confirmed = 0
        self._last_confirm = 0.0
        self._stream: ReplicationStream | None = None
        self._frames = FrameReader(
            self._window, self._batches.ready, self.table, self.layout,
            batch_size=settings.batch_size, more=self._more, message_event=self._message,
        )  # fmt: skip

    def alive(self) -> bool:
        """True unless the loop is wedged (``/healthz``); False too once the slot is gone."""
        if self.state.gone is not None:
            return False
        return time.monotonic() - self.heartbeat < max(self.settings.lease_seconds, 30.0)

    async def open(self) -> None:
        """Connect the table link and the sink; raise if either cannot be used."""
        await self.store.connect(CONNECT_TIMEOUT_SECONDS)
        await self.sink.start()
        self._opened = True

    async def run(self, stop: asyncio.Event) -> None:
        """Wait for the slot, read and deliver from it until ``stop`` is set; then finish the batch in hand."""
        try:
            while not stop.is_set():
                self.heartbeat = time.monotonic()
                try:
                    if not self._opened:
                        await self.open()
                    elif not self.store.connected:
                        await self.store.connect(CONNECT_TIMEOUT_SECONDS)
                    await self._lead(stop)
                except _NotLeading:
                    await self._sleep(stop, STANDBY_POLL_SECONDS)
                except SlotMissing as exc:
                    self.state.gone = str(exc)
                    logger.error(
                        "the slot cannot be read: %s (see docs/log-source.md, 'When the slot is gone')",
                        exc,
                        extra={"action": "slot_gone"},
                    )
                    await self._sleep(stop, 5.0)
                except (StoreUnavailable, SinkUnavailable) as exc:
                    if isinstance(exc, StoreUnavailable):
                        await self.store.close()  # a lock it may still hold goes with its session
                    logger.warning("log source: %s", exc, extra={"action": "store_retry"})
                    await self._sleep(stop, self._outage.next_delay())
        finally:
            await self._release()
            with contextlib.suppress(Exception):
                await self.sink.close()
            await self.store.close()

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
            self.heartbeat = time.monotonic()
            await sleep_unless_stopped(stop, min(left, 1.0))

    async def _release(self) -> None:
        if self._stream is not None:
            await self._stream.close()
            self._stream = None
        self.state.leading = False

    async def _lead(self, stop: asyncio.Event) -> None:
        """Take the slot's lock (or raise :class:`_NotLeading`), then read and deliver until stopped."""
        if not await self.store.try_lead():
            if self.state.leading:
                logger.warning("no longer the slot's reader", extra={"action": "slot_lost"})
            self.state.leading = False
            await self._observe_slot()
            raise _NotLeading
        self._reset()
        logger.info("reading slot %s", self.slot, extra={"action": "slot_lead"})
        self.state.leading = True
        await self._observe_slot()
        if self.state.gone is not None:
            raise SlotMissing(self.state.gone)
        self._stream = await self._start_stream(stop)
        self._batches.parked = await self.store.parked_keys()
        self._outage.reset()
        reader = asyncio.create_task(self._read(stop), name="log-reader")
        self._confirms_done = asyncio.Event()
        self._confirmer = asyncio.create_task(self._confirming(self._confirms_done), name="log-confirm")
        try:
            await self._deliver(stop, reader)
        finally:
            reader.cancel()
            await self._stop_confirming()
            await asyncio.gather(reader, return_exceptions=True)
            # Batches still with the sink end within their publish timeout; unconfirmed, they are read again.
            sending = [task for _, task in self._batches.in_flight]
            self._batches.in_flight.clear()
            if sending:
                bound = self.settings.publish_timeout_seconds + self._grace + 1.0
                await asyncio.wait(sending, timeout=bound)
                for task in sending:
                    task.cancel()
                await asyncio.gather(*sending, return_exceptions=True)
            await self._release()

    async def _start_stream(self, stop: asyncio.Event) -> ReplicationStream:
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
                if time.monotonic() > deadline or stop.is_set():
                    raise
                await self.store.end_stale_reader()
                await self._sleep(stop, 0.5)

    async def _observe_slot(self) -> None:
        found = await self.store.slot()
        if found is None:
            self.state.lag_bytes = self.state.wal_status = None
            self.state.gone = (
                f"slot {self.slot} does not exist (run outbox-relay migrate --source log --slot {self.slot})"
            )
        else:
            self.state.lag_bytes, self.state.wal_status, _ = found
            oldest = self._window.oldest_commit()
            self.state.lag_seconds = max(0.0, time.time() - oldest) if oldest else 0.0
            if self.state.wal_status == "lost":
                self.state.gone = f"slot {self.slot} was invalidated (wal_status lost, max_slot_wal_keep_size)"
            else:
                self.state.gone = None
        self.metrics.observe_slot(self.state.lag_bytes, self.state.lag_seconds, self.state.wal_status)

    # The reader.

    async def _read(self, stop: asyncio.Event) -> None:
        stream = self._stream
        assert stream is not None
        window, frames = self._window, self._frames
        while not stop.is_set():
            if window.full():
                self._room.clear()
                await self._room.wait()
                continue
            frames.take(await stream.read_frames(1.0, frames.room()))

    def _message(self, message: pgoutput.Message, commit_time: datetime) -> Event:
        try:
            return message_event(message.lsn, message.content, commit_time)
        except BadEnvelope as exc:
            # Dead-lettered at once: an event whose reason is its bad envelope (attempts past the maximum).
            event = Event(
                id=message.lsn,
                topic="",
                key=None,
                payload=message.content,
                headers={},
                idempotency_key=f"pg-message-{format_lsn(message.lsn)}",
                attempts=self.settings.max_attempts,
                created_at=commit_time,
                content_type="application/octet-stream",
            )
            event.chained = True  # marks it for the deliverer: dead at once
            self._batches.bad[id(event)] = str(exc)
            return event

    # The deliverer.

    async def _deliver(self, stop: asyncio.Event, reader: asyncio.Task[None]) -> None:
        batches = self._batches
        stream = self._stream
        assert stream is not None
        next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        next_observe = next_sweep = 0.0
        while not stop.is_set():
            self.heartbeat = time.monotonic()
            if reader.done():
                reader.result()  # a lost stream ends the leadership
                return
            batches.release_due()
            batches.count_held()
            if not self._window.full():
                self._room.set()  # the reader goes on (it waits while the window is full)
            if batches.sink_down and not batches.in_flight:
                await self._wait_for_sink(stop)
                batches.sink_down = False
                continue
            await batches.send_more()
            if batches.in_flight:
                to_sink, sending = batches.in_flight[0]
                await asyncio.wait([sending], timeout=1.0)
                if sending.done():
                    batches.in_flight.popleft()
                    await batches.settle(to_sink, sending.result())
            else:
                self._more.clear()
                wait = min(1.0, max(0.01, batches.next_due() - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._more.wait(), wait)
            if self._confirmer.done():
                self._confirmer.result()  # fenced, or the table link lost: the leadership ends
            now = time.monotonic()
            if self.store.busy:
                continue  # the confirm's statement runs: the chores below would wait on it, the delivery not
            if now >= next_sweep:
                next_sweep = now + SWEEP_SECONDS
                await batches.sweep(stop)
            if now >= next_observe:
                next_observe = now + 5.0
                await self._observe_slot()
            if now >= next_heartbeat and self._window.idle():
                next_heartbeat = now + HEARTBEAT_SECONDS
                await self.store.heartbeat()
        while batches.in_flight:  # stopping: the batches handed to the sink are settled, then confirmed
            to_sink, sending = batches.in_flight.popleft()
            await batches.settle(to_sink, await sending)
        if self._confirmer.done():
            self._confirmer.result()
        await self._stop_confirming()
        await self._confirm(final=True)

    async def _confirming(self, done: asyncio.Event) -> None:
        """Confirm beside the deliverer, so that no delivery waits on the fencing check, the delete or the
        status update (they cost the relay's latency p99 ~10 ms at 500 events/s on the deliverer's path)."""
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), CONFIRM_INTERVAL_SECONDS)
            if not done.is_set():
                await self._confirm()

    async def _stop_confirming(self) -> None:
        """Let the confirm in hand end (a cancel could cut the table link's statement); raises nothing."""
        self._confirms_done.set()
        confirmer = self._confirmer
        if not confirmer.done():
            await asyncio.wait([confirmer], timeout=CONNECT_TIMEOUT_SECONDS)
            confirmer.cancel()
        await asyncio.gather(confirmer, return_exceptions=True)

    async def _wait_for_sink(self, stop: asyncio.Event) -> None:
        """Back off until the broker answers, keeping the slot: the lock's session and the stream stay in use."""
        while not stop.is_set():
            deadline = time.monotonic() + self._sink_outage.next_delay()
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                await self._sleep(stop, min(left, STATUS_INTERVAL_SECONDS))
                if self._confirmer.done():  # it goes on fencing and telling the server where the slot is
                    self._confirmer.result()
            try:
                await self.sink.check()
            except SinkUnavailable:
                continue
            logger.info("broker reachable again", extra={"action": "sink_recovered"})
            return

    async def _confirm(self, *, final: bool = False) -> None:
        """Send the done prefix's end to the server, if it moved (or now and then), once fenced."""
        stream = self._stream
        if stream is None:
            return
        lsn = self._window.confirmable()
        target = max(self._confirmed, lsn or 0)
        if self._window.idle() and self._batches.settled():
            target = max(target, self._frames.idle_end)
        now = time.monotonic()
        moved = target > self._confirmed
        due = moved and now - self._last_confirm >= CONFIRM_INTERVAL_SECONDS
        if not (final or due or now - stream.last_status_at >= STATUS_INTERVAL_SECONDS):
            return
        rows, self._batches.delivered_rows = self._batches.delivered_rows, []
        if not await self.store.fence_and_delete(rows):
            raise Fenced("the slot's lock was lost: confirming nothing")
        await stream.confirm(target, reply=not moved)
        self._last_confirm = now
        if moved:
            self._confirmed = target
            logger.debug("confirmed %s", format_lsn(target), extra={"action": "confirm"})
