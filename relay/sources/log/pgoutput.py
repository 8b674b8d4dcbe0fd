"""The replication stream's frames and pgoutput's (protocol version 1) messages, parsed.

Frames (inside CopyBoth data): ``w`` XLogData (start LSN, end LSN, send time,
then one pgoutput message) and ``k`` primary keepalive (the server's WAL end,
send time, reply requested). The client sends ``r`` standby status updates.

pgoutput messages read here: ``B`` begin, ``C`` commit, ``R`` relation, ``I``
insert, ``M`` logical message; ``Y`` type, ``O`` origin, ``U``/``D`` update and
delete and ``T`` truncate are skipped (the publication publishes inserts only).
Column values come in text form (``t``), or null (``n``); ``u`` (an unchanged
TOASTed value) never comes in an insert.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

#: Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
PG_EPOCH_OFFSET_US = 946_684_800_000_000

_XLOG = struct.Struct("!QQq")
_KEEPALIVE = struct.Struct("!Qq?")
_STATUS = struct.Struct("!cQQQq?")
_BEGIN = struct.Struct("!Qqi")
_COMMIT = struct.Struct("!BQQq")
_INT32 = struct.Struct("!i")
_UINT32 = struct.Struct("!I")
_INT16 = struct.Struct("!h")
_LSN = struct.Struct("!Q")
_unpack_uint32 = _UINT32.unpack_from
#: An unsigned 32-bit big-endian integer (a relation oid, a length).
UINT32 = _UINT32

#: Where an XLogData frame's pgoutput message starts (after ``w``, start LSN, end LSN, send time).
XLOG_HEADER = 25
#: Frame kinds and the pgoutput message kind the reader takes apart itself (the commonest by far).
XLOG_DATA = 0x77  # 'w'
KEEPALIVE = 0x6B  # 'k'
INSERT = 0x49  # 'I'
#: The marker before an insert's new tuple.
NEW_TUPLE = 0x4E  # 'N'


class ProtocolError(Exception):
    """A frame or pgoutput message this client cannot read."""


def format_lsn(lsn: int) -> str:
    """``lsn`` as PostgreSQL writes it: ``16/B374D848``."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """A ``pg_lsn`` text (``16/B374D848``) as an integer."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def now_pg_us() -> int:
    """Now, in microseconds since 2000-01-01 (the protocol's timestamps)."""
    return time.time_ns() // 1000 - PG_EPOCH_OFFSET_US


def standby_status(lsn: int, *, reply: bool = False) -> bytes:
    """A standby status update saying ``lsn`` is written, flushed and applied (what the slot confirms)."""
    return _STATUS.pack(b"r", lsn, lsn, lsn, now_pg_us(), reply)


@dataclass(frozen=True, slots=True)
class Keepalive:
    """A primary keepalive: the server's WAL end, and whether it asks for a status update now."""

    wal_end: int
    reply: bool


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int
    commit_time_us: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    #: The end of the commit record: the position to confirm once the transaction's events are done.
    end_lsn: int
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    columns: tuple[str, ...]
    #: Each column's type oid (the Debezium layout reads its payload by type).
    types: tuple[int, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class Insert:
    relation: int
    #: Each column's value in text form (UTF-8 bytes), or None for a null.
    values: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class Message:
    transactional: bool
    lsn: int
    prefix: str
    content: bytes


Decoded = Begin | Commit | Relation | Insert | Message | None


def parse_frame(frame: bytes | memoryview) -> tuple[int, bytes] | Keepalive:
    """A CopyBoth frame: ``(start LSN, pgoutput message)`` for XLogData, or a :class:`Keepalive`."""
    kind = frame[0]
    if kind == 0x77:  # 'w'
        start, _end, _sent = _XLOG.unpack_from(frame, 1)
        return start, bytes(frame[25:])
    if kind == 0x6B:  # 'k'
        wal_end, _sent, reply = _KEEPALIVE.unpack_from(frame, 1)
        return Keepalive(wal_end, reply)
    raise ProtocolError(f"unexpected replication frame {chr(kind)!r}")


def xlog_start(frame: bytes) -> int:
    """An XLogData frame's start LSN."""
    return int(_LSN.unpack_from(frame, 1)[0])


def insert_relation(data: bytes, at: int) -> int:
    """The relation oid of the insert message at ``at``; its TupleData starts at ``at + 6``."""
    if data[at + 5] != 0x4E:  # 'N'
        raise ProtocolError(f"unexpected insert tuple marker {chr(data[at + 5])!r}")
    return int(_unpack_uint32(data, at + 1)[0])


def pick_columns(
    data: bytes, at: int, places: tuple[int, ...], size: int, into: list[bytes | None] | None = None
) -> list[bytes | None]:
    """The TupleData at ``at``, in one pass: column ``i``'s text bytes at ``places[i]`` of a list of ``size``
    (None for a null), the columns whose place is -1 skipped without a copy.

    ``into``, a list of ``size`` the caller reuses, is filled and returned when the message has every column
    of its relation (each place is then written, a null's too): no list is made per row. ``places`` covers
    every column of the relation: a message with more columns than it is refused.
    """
    count = (data[at] << 8) | data[at + 1]
    if count > len(places):
        raise ProtocolError(f"an insert of {count} columns, its relation has {len(places)}")
    at += 2
    if into is None or count < len(places):
        into = [None] * size
    values = into
    unpack = _unpack_uint32
    for place in places[:count] if count < len(places) else places:
        kind = data[at]
        if kind == 0x74:  # 't'
            start = at + 5
            at = start + unpack(data, at + 1)[0]
            if place >= 0:
                values[place] = data[start:at]
        elif kind == 0x6E or kind == 0x75:  # 'n' null; 'u' an unchanged TOASTed value, never in an insert
            at += 1
            if place >= 0:
                values[place] = None
        else:
            raise ProtocolError(f"unexpected tuple column kind {chr(kind)!r}")
    return values


def _cstring(data: bytes, at: int) -> tuple[str, int]:
    end = data.index(0, at)
    return data[at:end].decode(), end + 1


def _tuple(data: bytes, at: int) -> tuple[tuple[bytes | None, ...], int]:
    """A TupleData: each column's text bytes (undecoded: the reader decodes the ones it needs), or None."""
    count = (data[at] << 8) | data[at + 1]
    at += 2
    values: list[bytes | None] = [None] * count
    from_bytes = int.from_bytes
    for i in range(count):
        kind = data[at]
        if kind == 0x74:  # 't'
            length = from_bytes(data[at + 1 : at + 5], "big")
            at += 5
            values[i] = data[at : at + length]
            at += length
        elif kind == 0x6E or kind == 0x75:  # 'n' null; 'u' an unchanged TOASTed value, never in an insert
            at += 1
        else:
            raise ProtocolError(f"unexpected tuple column kind {chr(kind)!r}")
    return tuple(values), at


def transactional_message(data: bytes, at: int, prefix: bytes) -> tuple[int, bytes] | None:
    """The LSN and content of the message at ``at`` of ``data`` (its kind byte) when it is a transactional
    logical message with ``prefix``; None for any other message. :func:`parse_message` reads the rest."""
    if data[at] != 0x4D or not data[at + 1] or not data.startswith(prefix, at + 10) or data[at + 10 + len(prefix)]:
        return None
    (lsn,) = _LSN.unpack_from(data, at + 2)
    at += 11 + len(prefix)
    (length,) = _INT32.unpack_from(data, at)
    return lsn, data[at + 4 : at + 4 + length]


def parse_message(data: bytes) -> Decoded:
    """One pgoutput message; None for the kinds this source skips."""
    kind = data[0]
    if kind == 0x49:  # 'I'
        (relation,) = _UINT32.unpack_from(data, 1)
        if data[5] != 0x4E:  # 'N'
            raise ProtocolError(f"unexpected insert tuple marker {chr(data[5])!r}")
        values, _ = _tuple(data, 6)
        return Insert(relation, values)
    if kind == 0x42:  # 'B'
        return Begin(*_BEGIN.unpack_from(data, 1))
    if kind == 0x43:  # 'C'
        _flags, commit_lsn, end_lsn, at = _COMMIT.unpack_from(data, 1)
        return Commit(commit_lsn, end_lsn, at)
    if kind == 0x52:  # 'R'
        (oid,) = _UINT32.unpack_from(data, 1)
        namespace, at = _cstring(data, 5)
        name, at = _cstring(data, at)
        at += 1  # replica identity
        (count,) = _INT16.unpack_from(data, at)
        at += 2
        columns, types = [], []
        for _ in range(count):
            column, at = _cstring(data, at + 1)  # flags, then the name
            types.append(_UINT32.unpack_from(data, at)[0])
            at += 8  # type oid, type modifier
            columns.append(column)
        return Relation(oid, namespace, name, tuple(columns), tuple(types))
    if kind == 0x4D:  # 'M'
        transactional = bool(data[1])
        (lsn,) = _LSN.unpack_from(data, 2)
        prefix, at = _cstring(data, 10)
        (length,) = _INT32.unpack_from(data, at)
        return Message(transactional, lsn, prefix, data[at + 4 : at + 4 + length])
    if kind in b"YOUDTS":  # type, origin, update, delete, truncate: not outbox events
        return None
    raise ProtocolError(f"unexpected pgoutput message {chr(kind)!r}")
