"""Arguments publish() and apublish() refuse before any SQL, whatever the database: each with its error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone


def _lists(depth: int) -> list[object]:
    """``depth`` lists one in another."""
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


BAD_ARGUMENTS: list[tuple[dict[str, object], type[Exception]]] = [
    ({"topic": ""}, ValueError),
    ({"topic": "t" * 250}, ValueError),
    ({"headers": {"a": 1}}, TypeError),
    ({"headers": [("a", "b")]}, TypeError),
    ({"headers": "a=b"}, TypeError),
    ({"key": 5}, TypeError),
    ({"key": b"k"}, TypeError),
    ({"payload": float("nan")}, ValueError),
    ({"payload": {"a": [1, float("inf")]}}, ValueError),
    ({"payload": ["\ud800 lone"]}, ValueError),
    ({"payload": {"a": object()}}, TypeError),
    ({"idempotency_key": "i" * 201}, ValueError),
    ({"idempotency_key": b"id"}, TypeError),
    ({"idempotency_key": 5.0}, TypeError),
    ({"idempotency_key": True}, TypeError),
    ({"idempotency_key": ["id"]}, TypeError),
    ({"priority": 2**31}, ValueError),
    ({"priority": -(2**31) - 1}, ValueError),
    # Beyond the table's -1000..1000 (its writer_bounds trigger): one writer would go before every other's.
    ({"priority": 2**31 - 1}, ValueError),
    ({"priority": -(2**31)}, ValueError),
    ({"priority": 1001}, ValueError),
    ({"priority": -1001}, ValueError),
    # Past the table's 366 days, whatever max_deliver_ahead allows.
    ({"deliver_at": datetime(9999, 12, 31, tzinfo=UTC)}, ValueError),
    ({"deliver_at": datetime.now(UTC) + timedelta(days=730), "max_deliver_ahead": timedelta(days=3650)}, ValueError),
    ({"priority": "high"}, TypeError),
    ({"deliver_at": datetime(2030, 1, 1)}, ValueError),
    # Before year 1 in UTC: PostgreSQL would store a BC time no reader loads, MySQL's driver would overflow.
    ({"deliver_at": datetime(1, 1, 1, 3, tzinfo=timezone(timedelta(hours=5)))}, ValueError),
    # More than the key's 1,024 bytes (MySQL's column; PostgreSQL's index would abort the transaction).
    ({"key": "k" * 1025}, ValueError),
    ({"key": "\u00e9" * 513}, ValueError),
    ({"key": "\U0001f600" * 257}, ValueError),
    # NUL: PostgreSQL's text and jsonb cannot hold it, MySQL's would; refused on both.
    ({"topic": "t\x00"}, ValueError),
    ({"key": "k\x00"}, ValueError),
    ({"idempotency_key": "i\x00"}, ValueError),
    ({"headers": {"h\x00": "v"}}, ValueError),
    ({"headers": {"h": "\x00"}}, ValueError),
    ({"payload": {"a": "nul\x00inside"}}, ValueError),
    ({"payload": ["\x00"]}, ValueError),
    ({"payload": {"\x00": 1}}, ValueError),
    ({"payload": b"x", "content_type": "a/b\x00"}, ValueError),
    # Deeper than MariaDB's JSON keeps (31 levels), and past Python's recursion limit.
    ({"payload": _lists(32)}, ValueError),
    ({"payload": {"a": [{"b": [1] * 3}] * 2, "deep": _lists(3000)}}, ValueError),
    # A lone surrogate is no text: the codec's error, the same everywhere.
    ({"topic": "\ud800"}, ValueError),
    ({"key": "k\udfff"}, ValueError),
    ({"idempotency_key": "\udc80"}, ValueError),
    ({"headers": {1: "v"}}, TypeError),
    ({"headers": {"": "v"}}, TypeError),
    ({"priority": True}, TypeError),
    ({"priority": 1.0}, TypeError),
    ({"priority": None}, TypeError),
    ({"deliver_at": "2030-01-01T00:00:00Z"}, TypeError),
    ({"deliver_at": 0}, TypeError),
    ({"payload": {1, 2}}, TypeError),
    ({"topic": 5}, ValueError),
    ({"topic": None}, ValueError),
    # Options of the wrong type, checked whether or not they come into play.
    ({"max_deliver_ahead": 5}, TypeError),
    ({"max_deliver_ahead": "1 day"}, TypeError),
    ({"max_deliver_ahead": None}, TypeError),
    ({"max_deliver_ahead": 3600.0, "deliver_at": datetime(2030, 1, 1, tzinfo=UTC)}, TypeError),
    ({"table": 5}, TypeError),
    ({"table": None}, TypeError),
    ({"table": b"outbox"}, TypeError),
]
