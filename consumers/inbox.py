"""The inbox pattern: a consumer processes each outbox event once.

The relay delivers at least once, so a consumer sees some events twice. An
inbox table remembers the idempotency key of every event already processed.
``process_once`` records the key and runs the handler in one transaction of the
consumer's database: either both happen or neither does, so a duplicate is
skipped and a failed attempt leaves nothing behind for the redelivery.
"""

from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

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
# RETURNING, not rowcount: in pipeline mode rowcount is -1 until the pipeline syncs, and fetching syncs it.
# The transaction's id tells, after the handler, whether it is still the one that recorded the key.
_INSERT = (
    "INSERT INTO {table} (idempotency_key, topic) VALUES (%s, %s) ON CONFLICT (idempotency_key) DO NOTHING"
    " RETURNING pg_current_xact_id()::text"
)
_XACT = "SELECT pg_current_xact_id_if_assigned()::text"

HeaderValue = str | bytes | None


class HandlerLeftTransactionBroken(RuntimeError):
    """The handler returned, but the transaction that recorded the key cannot
    commit: a statement failed inside it (and the handler caught the error), or
    the handler ended it (COMMIT or ROLLBACK) itself.

    After a failed statement the key and the handler's writes are rolled back,
    so a redelivery is processed again. A handler that ended the transaction
    itself may have committed the key, or part of its work: fix the handler
    (roll back to a savepoint, or let the error propagate; never end the
    transaction it is given).
    """


class TransactionAlreadyOpen(RuntimeError):
    """``process_once`` was given a connection inside a transaction (or with
    commands of a pipeline not yet synced): it could not commit the key with the
    handler's writes before returning ``True``. Commit or roll back first.

    Also raised for a connection that another thread or task is using in
    ``process_once``: give each its own connection."""


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
    raised: ``True`` always means committed. A handler that returns a coroutine
    or a generator (an ``async def`` handler belongs to :func:`aprocess_once`)
    did not run its body: ``TypeError``, nothing recorded.

    The connection must not be inside a transaction (:class:`TransactionAlreadyOpen`):
    its commit would be the caller's, after this returned. Pipeline mode works.
    """
    _check_key(idempotency_key)
    with _exclusive(conn):
        _check_idle(conn.info.transaction_status)
        _, insert = _statements(table)
        with conn.transaction() as transaction:
            _check_outer(transaction.savepoint_name)
            recorded = _fetch(conn, insert, (idempotency_key, topic))
            if recorded is None:
                logger.debug("skipped a duplicate", extra={"action": "inbox_duplicate", "topic": topic})
                return False
            _check_ran(handler, handler(conn), topic)
            _check_transaction(conn.info.transaction_status, topic)
            _check_same_transaction(recorded, _current_xact(conn), topic)
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
    with _exclusive(conn):
        _check_idle(conn.info.transaction_status)
        _, insert = _statements(table)
        async with conn.transaction() as transaction:
            _check_outer(transaction.savepoint_name)
            recorded = await _afetch(conn, insert, (idempotency_key, topic))
            if recorded is None:
                logger.debug("skipped a duplicate", extra={"action": "inbox_duplicate", "topic": topic})
                return False
            _check_ran(handler, await handler(conn), topic)
            _check_transaction(conn.info.transaction_status, topic)
            _check_same_transaction(recorded, await _acurrent_xact(conn), topic)
        return True


def _check_ran(handler: object, result: object, topic: str | None) -> None:
    """Raise if the handler's work did not run: it returned an awaitable (an ``async def`` handler
    given to ``process_once``, or an async one returning ``conn.execute(...)`` without awaiting it),
    or it is a generator function, whose body waits for the first ``next``. Committing the key then
    would lose the event. (A generator the handler built and returned after its work is fine.)"""
    never_started = inspect.isgenerator(result) and result.gi_code is getattr(handler, "__code__", None)
    if inspect.iscoroutine(result) or (inspect.isgenerator(result) and never_started):
        result.close()  # no "never awaited" warning on top of the error
    if inspect.isawaitable(result) or never_started:
        raise TypeError(
            f"the handler returned a {type(result).__name__} that did not run (topic {topic!r}): nothing was "
            "recorded; give process_once a plain function and aprocess_once an async one, and await what they call"
        )


_in_use: weakref.WeakSet[Any] = weakref.WeakSet()
_in_use_lock = threading.Lock()


@contextmanager
def _exclusive(conn: Any) -> Iterator[None]:
    """Refuse a connection that another ``process_once`` (in another thread or task) is using.

    Its transaction is the connection's: a second call would join it as a savepoint, return True
    before the commit, and the first call's rollback (or its own ROLLBACK TO SAVEPOINT, run at any
    point of the first's transaction) would undo the key and the handler's writes.
    """
    with _in_use_lock:
        if conn in _in_use:
            _check_idle(psycopg.pq.TransactionStatus.INTRANS)
        _in_use.add(conn)
    try:
        yield
    finally:
        with _in_use_lock:
            _in_use.discard(conn)


def _check_idle(status: psycopg.pq.TransactionStatus) -> None:
    if status != psycopg.pq.TransactionStatus.IDLE:
        raise TransactionAlreadyOpen(
            "process_once needs a connection outside any transaction, to commit the key with the handler's writes "
            "before it returns True; this one is in a transaction (or has pipeline commands not synced yet): "
            "commit or roll back first"
        )


def _check_outer(savepoint_name: str | None) -> None:
    """Raise if ``conn.transaction()`` made a savepoint: a statement from another thread (or task)
    sharing the connection opened a transaction after :func:`_check_idle`. Inside it, the release of
    the savepoint would be taken for the commit, and that transaction's rollback would undo both."""
    if savepoint_name:  # "" or None for the outer transaction, by psycopg's version
        _check_idle(psycopg.pq.TransactionStatus.INTRANS)


def _fetch(conn: psycopg.Connection[Any], query: sql.Composed | str, params: tuple[Any, ...] = ()) -> Any:
    """The first column of the one row ``query`` returns (None without one), whatever the connection's row factory."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query, params).fetchone()
    return row[0] if row else None


async def _afetch(conn: psycopg.AsyncConnection[Any], query: sql.Composed | str, params: tuple[Any, ...] = ()) -> Any:
    async with conn.cursor(row_factory=tuple_row) as cur:
        row = await (await cur.execute(query, params)).fetchone()
    return row[0] if row else None


def _current_xact(conn: psycopg.Connection[Any]) -> str | None:
    try:
        return str(_fetch(conn, _XACT) or "") or None
    except psycopg.errors.InFailedSqlTransaction:  # a failed statement the pipeline had not reported yet
        raise _aborted(None) from None


async def _acurrent_xact(conn: psycopg.AsyncConnection[Any]) -> str | None:
    try:
        return str(await _afetch(conn, _XACT) or "") or None
    except psycopg.errors.InFailedSqlTransaction:
        raise _aborted(None) from None


def _aborted(topic: str | None) -> HandlerLeftTransactionBroken:
    return HandlerLeftTransactionBroken(
        f"the handler returned but its transaction cannot commit (a statement failed in it; topic {topic!r}): "
        "nothing was recorded"
    )


def _ended(topic: str | None) -> HandlerLeftTransactionBroken:
    return HandlerLeftTransactionBroken(
        f"the handler ended the transaction that recorded the key itself (COMMIT or ROLLBACK; topic {topic!r}): "
        "the key and the handler's writes may or may not be committed, and what the handler did after it is "
        "rolled back"
    )


def _check_transaction(status: psycopg.pq.TransactionStatus, topic: str | None) -> None:
    """Raise unless the handler left the transaction open and healthy.

    PostgreSQL answers COMMIT in an aborted transaction with a ROLLBACK and no
    error, so without this check the key and the writes would vanish while
    ``process_once`` reported success, and the consumer would move past the event.
    """
    if status == psycopg.pq.TransactionStatus.INERROR:
        raise _aborted(topic)
    if status == psycopg.pq.TransactionStatus.IDLE:
        raise _ended(topic)


def _check_same_transaction(recorded: str, current: str | None, topic: str | None) -> None:
    """Raise if the transaction is not the one that recorded the key: the handler
    ended that one and went on in another (a ROLLBACK, then more statements)."""
    if current != recorded:
        raise _ended(topic)


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="strict")
    return value if isinstance(value, str) and value else None


def idempotency_key_from_kafka(message: KafkaMessage) -> str:
    """The idempotency key the relay put in a Kafka message's ``idempotency-key`` header.

    Raises ``ValueError`` when the header is missing or empty, e.g. for a
    message that did not come through the relay, or repeated with different
    values.
    """
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    # Kafka headers are a list and may repeat a name. Two different keys leave the event's own
    # unknown: taking either could skip it as a duplicate of the event the other key belongs to.
    keys = {key for name, value in pairs if name == IDEMPOTENCY_HEADER and (key := _text(value)) is not None}
    if len(keys) > 1:
        raise ValueError(
            f"kafka message has more than one {IDEMPOTENCY_HEADER!r} header, with different values; "
            "messages published by outbox-relay carry exactly one"
        )
    if not keys:
        raise ValueError(
            f"kafka message has no {IDEMPOTENCY_HEADER!r} header; messages published by outbox-relay always carry one"
        )
    return keys.pop()


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
