"""The log relay: read the slot, publish, confirm the acknowledged prefix.

One reader per slot: a relay first takes the slot's lock (a session advisory
lock, :class:`relay.sources.log.slot.TableLink`); the others wait for it and
take over within seconds of the leader's end. Then:

- the reader reads the stream while the window has room, turning each outbox
  row and ``outbox`` message into an event, in commit order;
- the deliverer publishes them in batches through the sink, judges the
  outcomes as the table relay does (:func:`relay.outcomes.judge`), retries a
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
import bisect
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from relay.backoff import Backoff, OutageBackoff, sleep_unless_stopped
from relay.config import NATIVE, RelaySettings, TableLayout, TableName
from relay.errors import SinkTimeout, SinkUnavailable, StoreUnavailable
from relay.events import Event, Outcome
from relay.holds import KeyHolds
from relay.metrics import Metrics
from relay.outcomes import judge
from relay.sinks.base import Sink
from relay.sources.log import pgoutput
from relay.sources.log.debezium import DebeziumRowReader
from relay.sources.log.decode import HEARTBEAT_PREFIX, MESSAGE_PREFIX, BadEnvelope, RowReader, message_event
from relay.sources.log.handover import deliver_handed_over
from relay.sources.log.pgoutput import Keepalive, format_lsn
from relay.sources.log.slot import TableLink, publication_name
from relay.sources.log.stream import ReplicationStream, SlotBusy, SlotMissing
from relay.sources.log.window import Pending, Transaction, Window

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
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def _read_order(pending: Pending) -> int:
    return pending.seq


class Fenced(StoreUnavailable):
    """This relay no longer holds the slot's lock: it confirms nothing and starts over as a standby."""


@dataclass(slots=True)
class _Blocked:
    """A key's events waiting behind its first failed one, due again at ``due``."""

    #: In the order they were read (a batch still in flight may hand one back after later ones waited here).
    events: list[Pending]
    due: float


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
        self._ready: deque[Pending] = deque()
        self._blocked: dict[object, _Blocked] = {}
        # Batches handed to the sink, oldest first, and how many events of each key they hold.
        self._in_flight: deque[tuple[list[Pending], asyncio.Task[Sequence[Outcome] | SinkTimeout | SinkUnavailable]]]
        self._in_flight = deque()
        self._flying_keys: Counter[str] = Counter()
        self._holds = KeyHolds()
        self._sink_down = False
        self._parked: set[str] = set()
        self._delivered_rows: list[int] = []
        self._room = asyncio.Event()
        self._more = asyncio.Event()
        self._confirmed = 0
        self._idle_end = 0
        self._last_confirm = 0.0
        self._stream: ReplicationStream | None = None
        self._reading_done = False
        # Events of bad envelopes (by id()), and why: dead-lettered without a publish.
        self._bad: dict[int, str] = {}

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
        self._parked = await self.store.parked_keys()
        self._outage.reset()
        reader = asyncio.create_task(self._read(stop), name="log-reader")
        try:
            await self._deliver(stop, reader)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            # Batches still with the sink end within their publish timeout; unconfirmed, they are read again.
            sending = [task for _, task in self._in_flight]
            self._in_flight.clear()
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
        window = self._window
        rows: dict[int, RowReader | DebeziumRowReader | None] = {}
        schema_name = self.table.parts if len(self.table.parts) == 2 else ("public", self.table.parts[0])
        transaction: Transaction | None = None
        commit_time = datetime.now(UTC)
        while not stop.is_set():
            if window.full():
                self._room.clear()
                await self._room.wait()
                continue
            frame = await stream.read(1.0)
            if frame is None:
                continue
            if isinstance(frame, Keepalive):
                if window.idle() and not self._ready:
                    self._idle_end = max(self._idle_end, frame.wal_end)
                if frame.reply:
                    self._more.set()
                continue
            lsn, data = frame
            message = pgoutput.parse_message(data)
            if isinstance(message, pgoutput.Insert):
                reader = rows.get(message.relation)
                if reader is None or transaction is None:
                    continue
                event = reader.event(message.values, commit_time)
                if event is not None:
                    self._ready.append(window.add(event, transaction, row=True))
                    if len(self._ready) >= self.settings.batch_size:
                        self._more.set()
            elif isinstance(message, pgoutput.Begin):
                commit_time = _PG_EPOCH + timedelta(microseconds=message.commit_time_us)
                transaction = window.begin(commit_time.timestamp())
            elif isinstance(message, pgoutput.Commit):
                if transaction is not None:
                    transaction.end_lsn = message.end_lsn
                transaction = None
                self._more.set()
            elif isinstance(message, pgoutput.Relation):
                ours = (message.namespace, message.name) == schema_name
                if not ours:
                    rows[message.oid] = None
                else:
                    rows[message.oid] = (
                        DebeziumRowReader(message, self.layout) if self.layout.debezium else RowReader(message)
                    )
            elif isinstance(message, pgoutput.Message):
                if message.transactional and message.prefix == MESSAGE_PREFIX and self.layout.debezium:
                    # Debezium's table has no place for a message's topic: its dead letter could not be kept.
                    logger.warning(
                        "outbox message at %s not delivered: the Debezium table layout relays the table's rows only",
                        format_lsn(lsn),
                        extra={"action": "message_ignored"},
                    )
                elif message.transactional and message.prefix == MESSAGE_PREFIX and transaction is not None:
                    self._ready.append(window.add(self._message(message, commit_time), transaction, row=False))
                elif message.prefix == HEARTBEAT_PREFIX and transaction is None and window.idle() and not self._ready:
                    self._idle_end = max(self._idle_end, lsn)
                    self._more.set()
        self._reading_done = True

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
            self._bad[id(event)] = str(exc)
            return event

    # The deliverer.

    async def _deliver(self, stop: asyncio.Event, reader: asyncio.Task[None]) -> None:
        stream = self._stream
        assert stream is not None
        next_heartbeat = time.monotonic() + HEARTBEAT_SECONDS
        next_observe = next_sweep = 0.0
        while not stop.is_set():
            self.heartbeat = time.monotonic()
            if reader.done():
                reader.result()  # a lost stream ends the leadership
                return
            self._release_due()
            if not self._window.full():
                self._room.set()  # the reader goes on (it waits while the window is full)
            if self._sink_down and not self._in_flight:
                await self._wait_for_sink(stop)
                self._sink_down = False
                continue
            while len(self._in_flight) < self._depth and not self._sink_down:
                batch = self._take_batch()
                if not batch:
                    break
                to_sink = await self._prepare(batch)
                if to_sink:
                    sending = asyncio.create_task(self._send([p.event for p in to_sink]))
                    self._in_flight.append((to_sink, sending))
                    await asyncio.sleep(0)  # handed to the sink before the next batch
            if self._in_flight:
                to_sink, sending = self._in_flight[0]
                await asyncio.wait([sending], timeout=1.0)
                if sending.done():
                    self._in_flight.popleft()
                    await self._settle(to_sink, sending.result(), stop)
            else:
                self._more.clear()
                wait = min(1.0, max(0.01, self._next_due() - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._more.wait(), wait)
            await self._confirm()
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + SWEEP_SECONDS
                await self._sweep(stop)
            if now >= next_observe:
                next_observe = now + 5.0
                await self._observe_slot()
            if now >= next_heartbeat and self._window.idle():
                next_heartbeat = now + HEARTBEAT_SECONDS
                await self.store.heartbeat()
        while self._in_flight:  # stopping: the batches handed to the sink are settled, then confirmed
            to_sink, sending = self._in_flight.popleft()
            await self._settle(to_sink, await sending, stop)
        await self._confirm(final=True)

    def _next_due(self) -> float:
        return min((b.due for b in self._blocked.values()), default=time.monotonic() + 1.0)

    def _release_due(self) -> None:
        now = time.monotonic()
        flying = self._flying_keys
        # A key with events still in flight waits for them: they may come back, to go before the later ones.
        for key in [k for k, b in self._blocked.items() if b.due <= now and not (isinstance(k, str) and flying[k])]:
            # Its events go first, in order: nothing of the key was taken while it waited.
            self._ready.extendleft(reversed(self._blocked.pop(key).events))

    def _take_batch(self) -> list[Pending]:
        batch: list[Pending] = []
        size = 0
        ready = self._ready
        limit, max_bytes = self.settings.batch_size, self.settings.batch_bytes
        while ready and len(batch) < limit and size < max_bytes:
            pending = ready.popleft()
            key = pending.event.key
            if key is not None and key in self._blocked:
                bisect.insort(self._blocked[key].events, pending, key=_read_order)
                continue
            batch.append(pending)
            size += pending.size
        return batch

    async def _prepare(self, batch: list[Pending]) -> list[Pending]:
        """What of ``batch`` goes to the sink: bad envelopes are dead-lettered and events of parked keys
        written to the table here. Each event of a key with an earlier one in flight is chained."""
        to_sink: list[Pending] = []
        for pending in batch:
            event = pending.event
            if id(event) in self._bad:
                await self._dead(pending, self._bad.pop(id(event)))
            elif event.key is not None and event.key in self._parked:
                await self._park(pending)
            else:
                to_sink.append(pending)
        flying = self._flying_keys
        for pending in to_sink:
            event = pending.event
            event.attempts += 1
            key = event.key
            event.chained = key is not None and flying[key] > 0
            if key is not None:
                flying[key] += 1
        return to_sink

    async def _send(self, events: list[Event]) -> Sequence[Outcome] | SinkTimeout | SinkUnavailable:
        try:
            return await self.sink.publish(events, self._holds)
        except (SinkTimeout, SinkUnavailable) as exc:
            return exc

    async def _settle(
        self, to_sink: list[Pending], result: Sequence[Outcome] | SinkTimeout | SinkUnavailable, stop: asyncio.Event
    ) -> None:
        """Judge a published batch's outcomes, in the order the batches were handed to the sink."""
        now = time.monotonic()
        events = [p.event for p in to_sink]
        for event in events:
            if event.key is not None:
                self._flying_keys[event.key] -= 1
                if not self._flying_keys[event.key]:
                    del self._flying_keys[event.key]
        if isinstance(result, SinkTimeout):
            for event in events:
                event.attempts -= 1
            self._holds.hold(events)
            delay = self._timeouts.next_delay()
            logger.warning("no acknowledgement in time, %d events again in %.1fs: %s", len(events), delay, result)
            self._block(to_sink, now + delay)
            return
        if isinstance(result, SinkUnavailable):
            for event in events:
                event.attempts -= 1
            self._holds.hold(events)
            logger.warning("broker unavailable: %s", result, extra={"action": "sink_retry"})
            self._block(to_sink, 0.0)
            self._sink_down = True
            return
        outcomes = result
        self._sink_outage.reset()
        self._holds.hold([e for e, outcome in zip(events, outcomes, strict=False) if outcome is not None])
        verdict = judge(events, outcomes, self.settings, self._backoff, self.metrics)
        dead = {d.id: d.error for d in verdict.dead}
        retry = {r.id: r.delay_seconds for r in verdict.retry}
        held = {i: delay for delay, ids in verdict.held.items() for i in ids}
        timed_out = set(verdict.timed_out)
        if not timed_out:
            self._timeouts.reset()
        timeout_delay = self._timeouts.next_delay() if timed_out else 0.0
        for pending, outcome in zip(to_sink, outcomes, strict=True):
            event = pending.event
            if outcome is None:
                self._done(pending)
            elif event.key is not None and event.key in self._parked:
                event.attempts -= 1
                await self._park(pending)
            elif event.id in dead:
                await self._dead(pending, dead[event.id])
            else:
                if event.id not in retry:
                    event.attempts -= 1  # held back, timed out: no attempt spent
                delay = retry.get(event.id, held.get(event.id, timeout_delay if event.id in timed_out else 0.0))
                self._block([pending], now + delay)

    async def _sweep(self, stop: asyncio.Event) -> None:
        """Deliver what was handed over to the table and may go now; park exactly the keys it still holds."""
        if not stop.is_set():
            await deliver_handed_over(self.store, self.sink, self.settings, self._backoff, self.metrics)
        self._parked = await self.store.parked_keys()
        self.metrics.parked_keys.set(len(self._parked))

    def _block(self, pendings: list[Pending], due: float) -> None:
        for pending in pendings:
            key: object = pending.event.key if pending.event.key is not None else pending
            blocked = self._blocked.get(key)
            if blocked is None:
                self._blocked[key] = _Blocked([pending], due)
            else:
                bisect.insort(blocked.events, pending, key=_read_order)

    async def _wait_for_sink(self, stop: asyncio.Event) -> None:
        """Back off until the broker answers, keeping the slot: the lock's session and the stream stay in use."""
        while not stop.is_set():
            deadline = time.monotonic() + self._sink_outage.next_delay()
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                await self._sleep(stop, min(left, STATUS_INTERVAL_SECONDS))
                if not await self.store.leading():
                    raise Fenced("the slot's lock was lost while the broker was away")
                if self._stream is not None:
                    await self._stream.confirm(self._confirmed, reply=False)
            try:
                await self.sink.check()
            except SinkUnavailable:
                continue
            logger.info("broker reachable again", extra={"action": "sink_recovered"})
            return

    def _done(self, pending: Pending) -> None:
        if pending.row:
            self._delivered_rows.append(pending.event.id)
        self._window.done(pending)

    async def _dead(self, pending: Pending, reason: str) -> None:
        event = pending.event
        await self.store.write(event, row=pending.row, state="failed", reason=reason, attempts=event.attempts)
        if event.key is not None:
            self._parked.add(event.key)
        logger.warning("dead-lettered event %d into the table; key parked", event.id, extra={"action": "dead_letter"})
        self._window.done(pending)

    async def _park(self, pending: Pending) -> None:
        event = pending.event
        reason = f"parked: an earlier event of key {event.key!r} is dead-lettered"
        await self.store.write(event, row=pending.row, state="pending", reason=reason, attempts=0)
        self._window.done(pending)

    async def _confirm(self, *, final: bool = False) -> None:
        """Send the done prefix's end to the server, if it moved (or now and then), once fenced."""
        stream = self._stream
        if stream is None:
            return
        lsn = self._window.confirmable()
        target = max(self._confirmed, lsn or 0)
        if self._window.idle() and not self._ready and not self._blocked and not self._in_flight:
            target = max(target, self._idle_end)
        now = time.monotonic()
        moved = target > self._confirmed
        due = moved and now - self._last_confirm >= CONFIRM_INTERVAL_SECONDS
        if not (final or due or now - stream.last_status_at >= STATUS_INTERVAL_SECONDS):
            return
        if not await self.store.leading():
            raise Fenced("the slot's lock was lost: confirming nothing")
        rows, self._delivered_rows = self._delivered_rows, []
        await self.store.delete_delivered(rows)
        await stream.confirm(target, reply=not moved)
        self._last_confirm = now
        if moved:
            self._confirmed = target
            logger.debug("confirmed %s", format_lsn(target), extra={"action": "confirm"})
