"""The inbox pattern: a consumer processes each outbox event once.

The relay delivers at least once, so a consumer sees some events twice. An
inbox table remembers the idempotency key of every event already processed.
``process_once`` records the key and runs the handler in one transaction of the
consumer's database: either both happen or neither does, so a duplicate is
skipped and a failed attempt leaves nothing behind for the redelivery.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import cache
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import sql

from relay.config import TableName
from relay.events import IDEMPOTENCY_HEADER

logger = logging.getLogger(__name__)

DEFAULT_INBOX_TABLE = "inbox"

R = TypeVar("R")

_CREATE = (
    "CREATE TABLE IF NOT EXISTS {table} ("
    " idempotency_key text PRIMARY KEY,"
    " topic text,"
    " received_at timestamptz NOT NULL DEFAULT now())"
)
_INSERT = "INSERT INTO {table} (idempotency_key, topic) VALUES (%s, %s) ON CONFLICT (idempotency_key) DO NOTHING"

HeaderValue = str | bytes | None


class HandlerLeftTransactionBroken(RuntimeError):
    """The handler returned, but the transaction can no longer commit: a statement
    failed inside it (and the handler caught the error), or the handler ended it.

    The key and the handler's writes are rolled back, so a redelivery is
    processed again; fix the handler (roll back to a savepoint, or let the error
    propagate).
    """


class KafkaMessage(Protocol):
    """What :func:`idempotency_key_from_kafka` reads: a ``confluent_kafka.Message``."""

    def headers(self) -> Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue] | None:
        """The message headers, as confluent-kafka returns them."""
        ...


class AmqpProperties(Protocol):
    """What :func:`idempotency_key_from_amqp` reads: ``pika.BasicProperties`` or an aio-pika message."""

    @property
    def message_id(self) -> str | None:
        """The AMQP ``message-id`` property."""
        ...

    @property
    def headers(self) -> Mapping[str, Any] | None:
        """The AMQP headers table."""
        ...


@cache
def _statements(table: str) -> tuple[sql.Composed, sql.Composed]:
    identifier = sql.Identifier(*TableName.parse(table).parts)
    return sql.SQL(_CREATE).format(table=identifier), sql.SQL(_INSERT).format(table=identifier)


def _check_key(idempotency_key: str) -> None:
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise ValueError("idempotency_key must be a non-empty string")


def create_inbox(conn: psycopg.Connection[Any], table: str = DEFAULT_INBOX_TABLE) -> None:
    """Create the inbox table if it does not exist yet.

    ``table`` may be schema-qualified (``app.inbox``); an invalid name raises
    :class:`relay.errors.ConfigError`. Run it with your other migrations: two
    processes creating the same table at the same instant can race.
    """
    create, _ = _statements(table)
    with conn.transaction():
        conn.execute(create)


async def acreate_inbox(conn: psycopg.AsyncConnection[Any], table: str = DEFAULT_INBOX_TABLE) -> None:
    """The same as :func:`create_inbox`, for a psycopg ``AsyncConnection``."""
    create, _ = _statements(table)
    async with conn.transaction():
        await conn.execute(create)


def process_once(
    conn: psycopg.Connection[R],
    idempotency_key: str,
    handler: Callable[[psycopg.Connection[R]], object],
    *,
    topic: str | None = None,
    table: str = DEFAULT_INBOX_TABLE,
) -> bool:
    """Run ``handler(conn)`` unless ``idempotency_key`` was processed before.

    The key is recorded and the handler runs in one transaction, committed
    before this returns ``True``; the handler writes its side effects through
    ``conn`` so they commit (or roll back) together with the key. A key already
    recorded returns ``False`` without calling the handler. A concurrent call
    with the same key waits until this transaction ends, then skips (or, if it
    rolled back, processes). If the handler raises, the transaction rolls back,
    nothing is recorded and the exception propagates, so a redelivery is
    processed again. If the handler returns with the transaction aborted (it
    caught a database error) or ended, :class:`HandlerLeftTransactionBroken` is
    raised and nothing is recorded: ``True`` always means committed.

    On a connection already inside a transaction the work joins it as a
    savepoint and is committed with the caller's transaction.
    """
    _check_key(idempotency_key)
    _, insert = _statements(table)
    with conn.transaction():
        inserted = conn.execute(insert, (idempotency_key, topic)).rowcount == 1
        if not inserted:
            logger.debug("skipped a duplicate", extra={"action": "inbox_duplicate", "topic": topic})
            return False
        handler(conn)
        _check_transaction(conn.info.transaction_status, topic)
    return True


async def aprocess_once(
    conn: psycopg.AsyncConnection[R],
    idempotency_key: str,
    handler: Callable[[psycopg.AsyncConnection[R]], Awaitable[object]],
    *,
    topic: str | None = None,
    table: str = DEFAULT_INBOX_TABLE,
) -> bool:
    """The same as :func:`process_once`, for an ``AsyncConnection`` and an async handler."""
    _check_key(idempotency_key)
    _, insert = _statements(table)
    async with conn.transaction():
        inserted = (await conn.execute(insert, (idempotency_key, topic))).rowcount == 1
        if not inserted:
            logger.debug("skipped a duplicate", extra={"action": "inbox_duplicate", "topic": topic})
            return False
        await handler(conn)
        _check_transaction(conn.info.transaction_status, topic)
    return True


def _check_transaction(status: psycopg.pq.TransactionStatus, topic: str | None) -> None:
    """Raise unless the handler left the transaction open and healthy.

    PostgreSQL answers COMMIT in an aborted transaction with a ROLLBACK and no
    error, so without this check the key and the writes would vanish while
    ``process_once`` reported success, and the consumer would move past the event.
    """
    if status == psycopg.pq.TransactionStatus.INTRANS:
        return
    why = "a statement failed in it" if status == psycopg.pq.TransactionStatus.INERROR else "the handler ended it"
    raise HandlerLeftTransactionBroken(
        f"the handler returned but its transaction cannot commit ({why}; topic {topic!r}): nothing was recorded"
    )


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="strict")
    return value if isinstance(value, str) and value else None


def idempotency_key_from_kafka(message: KafkaMessage) -> str:
    """The idempotency key the relay put in a Kafka message's ``idempotency-key`` header.

    Raises ``ValueError`` when the header is missing or empty, e.g. for a
    message that did not come through the relay.
    """
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    for name, value in pairs:
        if name == IDEMPOTENCY_HEADER:
            key = _text(value)
            if key is not None:
                return key
    raise ValueError(
        f"kafka message has no {IDEMPOTENCY_HEADER!r} header; messages published by outbox-relay always carry one"
    )


def idempotency_key_from_amqp(properties: AmqpProperties) -> str:
    """The idempotency key of a RabbitMQ message: its ``message_id``, else its ``idempotency-key`` header.

    Raises ``ValueError`` when neither is set.
    """
    key = _text(properties.message_id)
    if key is None:
        key = _text((properties.headers or {}).get(IDEMPOTENCY_HEADER))
    if key is None:
        raise ValueError(
            f"AMQP message has neither a message_id nor an {IDEMPOTENCY_HEADER!r} header; "
            "messages published by outbox-relay always carry both"
        )
    return key
