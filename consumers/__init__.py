"""Consumer-side helpers: process each outbox event once (the inbox pattern).

>>> with psycopg.connect(url) as conn:
...     consumers.create_inbox(conn)
...     key = consumers.idempotency_key_from_kafka(message)
...     consumers.process_once(conn, key, lambda c: c.execute("INSERT INTO shipments ..."))

The relay delivers at least once; ``process_once`` records the event's
idempotency key in an ``inbox`` table in the same transaction as the handler's
own writes, so a redelivered event is skipped and a failed one is retried.
"""

from __future__ import annotations

from consumers.inbox import (
    DEFAULT_INBOX_TABLE,
    HandlerLeftTransactionBroken,
    TransactionAlreadyOpen,
    acreate_inbox,
    aprocess_once,
    create_inbox,
    idempotency_key_from_amqp,
    idempotency_key_from_kafka,
    process_once,
)

__all__ = [
    "DEFAULT_INBOX_TABLE",
    "HandlerLeftTransactionBroken",
    "TransactionAlreadyOpen",
    "acreate_inbox",
    "aprocess_once",
    "create_inbox",
    "idempotency_key_from_amqp",
    "idempotency_key_from_kafka",
    "process_once",
]
