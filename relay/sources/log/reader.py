"""The log relay's reader: the stream's frames, in commit order, turned into events in the window.

Frames come in lists (all that one wait on the socket brought, as many as the
window has room for) and are taken apart in one pass each: an insert, by far
the commonest message, is read straight from the frame, its needed columns
only (:func:`.pgoutput.pick_columns`), into an event, and an ``outbox``
message's content straight into its event; the other messages go through
:func:`.pgoutput.parse_message`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from relay.config import TableLayout, TableName
from relay.sources.log import pgoutput
from relay.sources.log.debezium import DebeziumRowReader
from relay.sources.log.decode import HEARTBEAT_PREFIX, MESSAGE_PREFIX, RowReader
from relay.sources.log.pgoutput import (
    INSERT,
    KEEPALIVE,
    NEW_TUPLE,
    XLOG_DATA,
    XLOG_HEADER,
    format_lsn,
    insert_relation,
    transactional_message,
)
from relay.sources.log.window import Pending, Transaction, Window

logger = logging.getLogger(__name__)

_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
#: Where an insert's TupleData starts in its frame: after the message kind, the relation oid and ``N``.
_TUPLE_AT = XLOG_HEADER + 6
#: An insert's relation oid, read in the loop (a call per row to insert_relation cost as much as the read).
oid_at = pgoutput.UINT32.unpack_from
_MESSAGE = 0x4D  # 'M'
_OUTBOX = MESSAGE_PREFIX.encode()


class FrameReader:
    """Turns frames into events appended to ``ready`` (and the window), keeping the open transaction."""

    def __init__(
        self,
        window: Window,
        ready: deque[Pending],
        table: TableName,
        layout: TableLayout,
        *,
        batch_size: int,
        more: asyncio.Event,
        message_event: Callable[[int, bytes, datetime], Pending],
    ) -> None:
        self._window = window
        self._ready = ready
        self._layout = layout
        self._schema_name = table.parts if len(table.parts) == 2 else ("public", table.parts[0])
        self._batch_size = batch_size
        self._more = more
        #: Builds an ``outbox`` message's event from its LSN and content (a bad envelope's too).
        self._message_event = message_event
        #: Whether ``outbox`` messages are events (not with Debezium's table layout).
        self._messages = not layout.debezium
        self._rows: dict[int, RowReader | DebeziumRowReader | None] = {}
        self._transaction: Transaction | None = None
        self._commit_time = datetime.now(UTC)
        #: The furthest position seen with nothing of ours unconfirmed before it (keepalives, heartbeats).
        self.idle_end = 0
        #: A keepalive asked for a reply: the reader answers it (:meth:`.stream.ReplicationStream.answer`).
        self.reply_wanted = False

    def room(self) -> int:
        """How many frames may be taken now: as many as the window has room for events."""
        return self._window.room()

    def take(self, frames: list[bytes]) -> None:
        """Read ``frames``, in order."""
        rows = self._rows
        ready = self._ready
        # The rows read since the last other message, all of one transaction: into the window at once.
        read: list[Pending] = []
        transaction = self._transaction
        commit_time = self._commit_time
        for frame in frames:
            kind = frame[0]
            if kind == XLOG_DATA and frame[XLOG_HEADER] == INSERT:
                if frame[_TUPLE_AT - 1] != NEW_TUPLE:
                    insert_relation(frame, XLOG_HEADER)  # raises ProtocolError
                reader = rows.get(oid_at(frame, XLOG_HEADER + 1)[0])
                if reader is not None and transaction is not None:
                    event = reader.event_at(frame, _TUPLE_AT, commit_time)
                    if event is not None:
                        read.append(event if isinstance(event, Pending) else Pending.of(event))
                continue
            if kind == XLOG_DATA and frame[XLOG_HEADER] == _MESSAGE and transaction is not None and self._messages:
                found = transactional_message(frame, XLOG_HEADER, _OUTBOX)
                if found is not None:
                    pending = self._message_event(found[0], found[1], commit_time)
                    pending.row = False
                    read.append(pending)
                    continue
            if read:
                self._add(read, transaction)
                read = []
            if kind == XLOG_DATA:
                self._other(pgoutput.xlog_start(frame), pgoutput.parse_message(frame[XLOG_HEADER:]))
                transaction, commit_time = self._transaction, self._commit_time
            elif kind == KEEPALIVE:
                keepalive = pgoutput.parse_frame(frame)
                assert isinstance(keepalive, pgoutput.Keepalive)
                if self._window.idle() and not ready:
                    self.idle_end = max(self.idle_end, keepalive.wal_end)
                if keepalive.reply:
                    self.reply_wanted = True
                    self._more.set()
            else:
                pgoutput.parse_frame(frame)  # raises ProtocolError
        if read:
            self._add(read, transaction)
        if len(ready) >= self._batch_size:
            self._more.set()

    def _add(self, read: list[Pending], transaction: Transaction | None) -> None:
        assert transaction is not None  # rows and messages are read only inside a transaction
        self._window.add_read(read, transaction)
        self._ready.extend(read)

    def _other(self, lsn: int, message: pgoutput.Decoded) -> None:
        window = self._window
        if isinstance(message, pgoutput.Begin):
            self._commit_time = _PG_EPOCH + timedelta(microseconds=message.commit_time_us)
            self._transaction = window.begin(self._commit_time.timestamp())
        elif isinstance(message, pgoutput.Commit):
            if self._transaction is not None:
                self._transaction.end_lsn = message.end_lsn
            self._transaction = None
            self._more.set()
        elif isinstance(message, pgoutput.Insert):  # not reached: inserts are read in take()
            raise pgoutput.ProtocolError("an insert outside take()")
        elif isinstance(message, pgoutput.Relation):
            if (message.namespace, message.name) != self._schema_name:
                self._rows[message.oid] = None
            else:
                layout = self._layout
                # A native row is read straight into its window entry; a Debezium row's event is copied into one.
                rows = DebeziumRowReader(message, layout) if layout.debezium else RowReader(message, Pending)
                self._rows[message.oid] = rows
        elif isinstance(message, pgoutput.Message):
            ours = message.transactional and message.prefix == MESSAGE_PREFIX
            if ours and self._layout.debezium:
                # Debezium's table has no place for a message's topic: its dead letter could not be kept.
                logger.warning(
                    "outbox message at %s not delivered: the Debezium table layout relays the table's rows only",
                    format_lsn(lsn),
                    extra={"action": "message_ignored"},
                )
            elif message.prefix == HEARTBEAT_PREFIX and self._transaction is None and window.idle() and not self._ready:
                self.idle_end = max(self.idle_end, lsn)
                self._more.set()
