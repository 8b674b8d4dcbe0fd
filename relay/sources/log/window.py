"""The events in flight from the log, and the position that may be confirmed.

Only the contiguous done prefix is confirmed (as Kafka Connect's source tasks
commit offsets, and Debezium flushes the LSN once its offsets are committed):
the end of the last transaction all of whose events, and all before it, were
acknowledged or dead-lettered. A transaction partly done is not confirmed, and
after a crash it is read again whole (duplicates, never a loss).

The window is bounded in events and bytes: while it is full the reader stops
reading, and the server waits on the socket (TCP backpressure), so a 100,000-event
transaction or a slot far behind never sits whole in memory. Events held behind
their key's own failure (a retry waiting for its backoff) have a bound of their
own, ``HELD_FACTOR`` times the events': one key's retries must not stop the
reading for every other key, and the other keys flow on until that bound too
(or the bytes') is reached.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from relay.events import Event

#: How many events may wait behind their keys' retries, as a multiple of the window's events.
HELD_FACTOR = 4


@dataclass(slots=True, eq=False)
class Transaction:
    """One transaction read from the log: its events not done yet, and its end once its commit came."""

    pending: int = 0
    end_lsn: int | None = None
    #: When it committed (Unix seconds): the slot's lag in seconds is the oldest one's age.
    committed_at: float = 0.0


@dataclass(slots=True, eq=False)
class Pending(Event):
    """An event read from the log, in flight until acknowledged or dead-lettered: the event the sink is
    handed, with the window's bookkeeping on it (one object per event between the reader and the sink).

    The reader builds it as an event (its fields by position); the window fills in the rest as it takes it
    (:meth:`Window.add`, :meth:`Window.add_read`). Equal as events are; never a key of a dict or set.
    """

    transaction: Transaction = field(init=False, repr=False)
    size: int = field(init=False)
    #: Whether the event came from a table row (its row is deleted once acknowledged) or a message (the reader
    #: says so of a message).
    row: bool = field(init=False, default=True)
    #: Its place in the order events were read.
    seq: int = field(init=False)
    done: bool = field(init=False)

    @classmethod
    def of(cls, event: Event) -> Pending:
        """``event`` (a message's, a Debezium row's) as one to put in the window."""
        if isinstance(event, Pending):
            return event
        return cls(
            event.id, event.topic, event.key, event.payload, event.headers, event.idempotency_key,
            event.attempts, event.created_at, event.chained, event.content_type,
        )  # fmt: skip


class Window:
    """Transactions read and not confirmed yet, in commit order, and the events they hold in flight."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.events = 0
        self.bytes = 0
        #: Of ``events``, those held behind their key's retry (set by the deliverer).
        self.held = 0
        self._read = 0
        self._transactions: deque[Transaction] = deque()

    def begin(self, committed_at: float = 0.0) -> Transaction:
        transaction = Transaction(committed_at=committed_at)
        self._transactions.append(transaction)
        return transaction

    def add(self, event: Event, transaction: Transaction, *, row: bool) -> Pending:
        """``event`` read in ``transaction``, alone (:meth:`add_read` of one), in flight in the window from now."""
        pending = Pending.of(event)
        pending.row = row
        self.add_read([pending], transaction)
        return pending

    def add_read(self, pendings: list[Pending], transaction: Transaction) -> None:
        """:meth:`add` for each of ``pendings``, read in ``transaction`` (rows, and messages the reader marked
        so): the counts move once."""
        seq = self._read
        size = 0
        for pending in pendings:
            seq += 1
            pending.seq = seq
            pending.size = event_size = len(pending.payload) + 64
            size += event_size
            pending.transaction = transaction
            pending.done = False
        transaction.pending += len(pendings)
        self.events += len(pendings)
        self.bytes += size
        self._read = seq

    def done(self, pending: Pending) -> None:
        """``pending`` was acknowledged, dead-lettered or parked in the table: it holds its transaction no more."""
        if pending.done:
            return
        pending.done = True
        pending.transaction.pending -= 1
        self.events -= 1
        self.bytes -= pending.size

    def all_done(self, pendings: Iterable[Pending]) -> None:
        """:meth:`done` for each of ``pendings`` (a batch all acknowledged), the window's counts moved once."""
        events = size = 0
        for pending in pendings:
            if not pending.done:
                pending.done = True
                pending.transaction.pending -= 1
                events += 1
                size += pending.size
        self.events -= events
        self.bytes -= size

    def full(self) -> bool:
        """No room to read: too many events in flight (besides the held ones), held ones, or bytes."""
        held = self.held
        return (
            self.events - held >= self.max_events
            or held >= self.max_events * HELD_FACTOR
            or self.bytes >= self.max_bytes
        )

    def room(self) -> int:
        """How many more events may be read before the window is full by its count (one at least)."""
        return max(1, self.max_events - (self.events - self.held))

    def idle(self) -> bool:
        """Nothing read is unconfirmed, and no transaction is open."""
        return not self._transactions

    def oldest_commit(self) -> float | None:
        """When the oldest unconfirmed transaction committed (Unix seconds); None with none."""
        return self._transactions[0].committed_at if self._transactions else None

    def confirmable(self) -> int | None:
        """The end of the last transaction of the done prefix (dropped from the window), or None."""
        last = None
        transactions = self._transactions
        while transactions and transactions[0].pending == 0 and transactions[0].end_lsn is not None:
            last = transactions.popleft().end_lsn
        return last
