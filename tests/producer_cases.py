"""Arguments publish() and apublish() refuse before any SQL, whatever the database: each with its error."""

from __future__ import annotations

from datetime import datetime

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
    ({"priority": "high"}, TypeError),
    ({"deliver_at": datetime(2030, 1, 1)}, ValueError),
]
