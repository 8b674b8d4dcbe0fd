"""The bare loops of a relay that leases each row: what any such relay could reach here, at most.

The baselines (L_db, L_db_mysql) claim and delete in one step; a relay that
keeps the at-least-once, crash-counting promises (docs/ordering.md) must first
lease each row (write a token, an owner, an expiry and the attempt) and only
delete it once the broker has acknowledged it. These loops do exactly that and
nothing else: no ordering check, no broker, no events built, a keyset on the id
instead of the relay's scan (exact for a backlog of one priority, as the
bench's are: it would skip rows of a lower priority), on two connections that overlap as the relay's
claim and settle connections do (the next claim runs while the previous batch
is deleted, at most ``depth`` batches queued for it besides the one being
deleted). Their rate over the baseline's, in the same run, is what a relay of
that design has to work with on this machine before anything of its own:
the relay does all of this and more.

- ``l_lease`` (PostgreSQL): ``UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED)
  RETURNING`` the columns the relay reads, then ``DELETE … WHERE id = ANY(…)
  AND claim_token = …``.
- ``l_lease_kafka`` (PostgreSQL to Kafka): ``l_lease`` that also produces each
  batch with the relay's producer settings and deletes it only once every
  message of it is acknowledged (a thread polls the producer, as the relay's
  does): the most a relay written in Python with confluent-kafka, leasing each
  row, gets here.
- ``l_steps_mysql`` (MySQL/MariaDB, issue 17): the issue's two-step claim
  (``SELECT … FOR UPDATE SKIP LOCKED``, the lease ``UPDATE``, ``COMMIT``), with
  its step 4, the read of the rows by token, folded into the locking read as
  the relay's store does (it costs one round trip less, and ``claim_token`` has
  no index); then ``DELETE … WHERE id IN (…) AND claim_token = …`` and
  ``COMMIT``, at READ COMMITTED.
- ``l_keyed_steps_mysql`` (MySQL/MariaDB, issue 39): ``l_steps_mysql`` whose
  locking read also makes the least check of per-key order a claim that
  keeps nothing between claims must make: a keyed row goes only if its key
  has no earlier unsent event (pending, leased or not, or dead-lettered).
  One probe of the key index per keyed row (its key's first pending event),
  and one of the dead letters' index only while the table has a dead letter
  (an uncorrelated ``NOT EXISTS``, evaluated once a statement). The check is
  a column, not a condition: the read stays bounded by its limit, as the
  relay's does, and the rows that fail it are locked and left. The keyset
  stops before the first of them (every row below it is leased); a claim
  that leases nothing waits for the batches in hand to be deleted, and one
  that still leases nothing then ends the drain. No runs (a key's later
  event waits for the delete of its earlier one) and no state between
  claims: what the per-key promise costs a stateless claim, at least.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Producer

from relay.config import BATCH_SIZE, PIPELINE_DEPTH, PUBLISH_TIMEOUT_SECONDS, KafkaSinkConfig
from relay.events import IDEMPOTENCY_HEADER
from relay.sinks.kafka import producer_config

#: The relay's own defaults: the loop gets every lever the relay has.
BATCH = BATCH_SIZE
DEPTH = PIPELINE_DEPTH
LEASE_SECONDS = 60

PG_CLAIM = """
UPDATE outbox AS o
SET claim_token = %(token)s, lease_owner = 'bench-lease-loop',
    lease_expires_at = now() + make_interval(secs => %(lease)s), attempts = o.attempts + 1
FROM (SELECT id FROM outbox
      WHERE state = 'pending' AND id > %(after)s AND lease_expires_at IS NULL AND deliver_at <= now()
      ORDER BY priority DESC, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) AS c
WHERE o.id = c.id
RETURNING o.id, o.topic, o.key, o.payload::text, o.headers::text, o.idempotency_key, o.attempts, o.created_at
"""
PG_SETTLE = "DELETE FROM outbox WHERE id = ANY(%(ids)s::bigint[]) AND claim_token = %(token)s"

MYSQL_SELECT = (
    "SELECT id, topic, `key`, payload, headers, idempotency_key, attempts, created_at, priority FROM outbox"
    " WHERE state = 'pending' AND id > %s AND lease_expires_at = '1000-01-01 00:00:00'"
    " AND deliver_at <= UTC_TIMESTAMP(6)"
    " ORDER BY priority DESC, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
MYSQL_LEASE = (
    "UPDATE outbox SET claim_token = %s, lease_owner = 'bench-lease-loop',"
    " lease_expires_at = UTC_TIMESTAMP(6) + INTERVAL %s SECOND, attempts = attempts + 1 WHERE id IN %s"
)
MYSQL_SETTLE = "DELETE FROM outbox WHERE id IN %s AND claim_token = %s"
#: MYSQL_SELECT with the least per-key check as its last column, ``first``: the row has no key, or its key's
#: first pending event is itself and no dead letter of its key comes before it. The key probe stops at its first
#: entry (ORDER BY id LIMIT 1): a NOT EXISTS of an earlier pending event reads every pending entry of the key on
#: MariaDB (10 a row over 5,000 keys). The dead letters of a key are few, when there are any.
MYSQL_KEYED_SELECT = (
    "SELECT o.id, o.topic, o.`key`, o.payload, o.headers, o.idempotency_key, o.attempts, o.created_at, o.priority,"
    " o.`key` IS NULL OR ((SELECT p.id FROM outbox AS p WHERE p.`key` = o.`key` AND p.state = 'pending'"
    "                      ORDER BY p.id LIMIT 1) = o.id"
    "  AND (NOT EXISTS (SELECT 1 FROM outbox AS f WHERE f.state = 'failed')"
    "       OR NOT EXISTS (SELECT 1 FROM outbox AS d WHERE d.state = 'failed' AND d.`key` = o.`key` AND d.id < o.id)))"
    " AS first"
    " FROM outbox AS o"
    " WHERE o.state = 'pending' AND o.id > %s AND o.lease_expires_at = '1000-01-01 00:00:00'"
    " AND o.deliver_at <= UTC_TIMESTAMP(6)"
    " ORDER BY o.priority DESC, o.id LIMIT %s FOR UPDATE SKIP LOCKED"
)

#: A claim gives (the batch's ids, its token), or None once the table is drained; no ids: nothing it may lease
#: until the batches in hand are deleted.
Claim = Callable[[int], "tuple[list[int], str] | None"]
Settle = Callable[[list[int], str], None]


def _overlapped(claim: Claim, settle: Settle, *, depth: int, seconds: float | None = None) -> dict[str, Any]:
    """Claim on this thread and settle on another, at most ``depth`` batches queued between them; the rate.

    With ``seconds``, no claim starts after that long: the rate is then of what was settled by the end, the
    batches in hand included (a loop that drains a backlog that slowly is measured on its first part)."""
    handed: queue.Queue[tuple[list[int], str] | None] = queue.Queue(maxsize=depth)
    failures: list[BaseException] = []
    settled = [0]

    def settler() -> None:
        try:
            while (item := handed.get()) is not None:
                settle(*item)
                settled[0] += len(item[0])
                handed.task_done()
        except BaseException as exc:  # noqa: BLE001 - raised again on the claiming thread
            failures.append(exc)
            handed.task_done()
            while handed.get() is not None:  # let the claims end
                handed.task_done()

    thread = threading.Thread(target=settler, name="lease-loop-settle", daemon=True)
    started = time.perf_counter()
    thread.start()
    after = 0
    waited = False
    try:
        while (
            not failures
            and (seconds is None or time.perf_counter() - started < seconds)
            and (batch := claim(after)) is not None
        ):
            if not batch[0]:
                if waited:  # nothing in hand, and still nothing to lease: what is left waits on others
                    break
                handed.join()  # every batch handed over deleted
                waited = True
                continue
            waited = False
            after = max(batch[0])
            handed.put(batch)
    finally:
        handed.put(None)
        thread.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise failures[0]
    return {"events": settled[0], "seconds": elapsed, "rate": settled[0] / elapsed if elapsed else 0.0}


def _pg_claim(conn: psycopg.Connection[Any], after: int, batch: int) -> tuple[str, list[Any]]:
    """Lease up to ``batch`` rows after id ``after``: the claim's token and its rows."""
    token = str(uuid.uuid4())
    rows = conn.execute(PG_CLAIM, {"token": token, "lease": LEASE_SECONDS, "after": after, "limit": batch}).fetchall()
    return token, rows


def l_lease(database_url: str, *, batch: int = BATCH, depth: int = DEPTH) -> dict[str, Any]:
    """Drain the outbox with the bare lease-then-delete loop on PostgreSQL; events per second."""
    with (
        psycopg.connect(database_url, autocommit=True) as claiming,
        psycopg.connect(database_url, autocommit=True) as settling,
    ):

        def claim(after: int) -> tuple[list[int], str] | None:
            token, rows = _pg_claim(claiming, after, batch)
            return ([row[0] for row in rows], token) if rows else None

        def settle(ids: list[int], token: str) -> None:
            settling.execute(PG_SETTLE, {"ids": ids, "token": token})

        return _overlapped(claim, settle, depth=depth)


def l_lease_kafka(database_url: str, bootstrap: str, *, batch: int = BATCH, depth: int = DEPTH) -> dict[str, Any]:
    """``l_lease`` with each batch produced to Kafka (each row to its own topic, with its key and the
    idempotency header) and deleted once all of it is acknowledged; events per second."""
    settings = producer_config(
        KafkaSinkConfig(bootstrap_servers=bootstrap), publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS, client_id="bench"
    )
    producer = Producer(settings)
    stop = threading.Event()
    failed: list[str] = []

    def poll() -> None:
        while not stop.is_set():
            producer.poll(0.05)

    poller = threading.Thread(target=poll, name="lease-loop-poll", daemon=True)
    poller.start()
    acked: dict[str, threading.Event] = {}
    try:
        with (
            psycopg.connect(database_url, autocommit=True) as claiming,
            psycopg.connect(database_url, autocommit=True) as settling,
        ):

            def claim(after: int) -> tuple[list[int], str] | None:
                token, rows = _pg_claim(claiming, after, batch)
                if not rows:
                    return None
                done, left = threading.Event(), [len(rows)]
                lock = threading.Lock()

                def delivered(error: Any, _message: Any) -> None:
                    if error is not None:
                        failed.append(str(error))
                    with lock:
                        left[0] -= 1
                        if not left[0]:
                            done.set()

                acked[token] = done
                for row in rows:
                    while True:
                        try:
                            producer.produce(
                                row[1],
                                row[3].encode(),
                                row[2],
                                on_delivery=delivered,
                                headers=[(IDEMPOTENCY_HEADER, row[5])],
                            )
                            break
                        except BufferError:
                            time.sleep(0.001)
                producer.poll(0)
                return [row[0] for row in rows], token

            def settle(ids: list[int], token: str) -> None:
                if not acked.pop(token).wait(PUBLISH_TIMEOUT_SECONDS):
                    raise TimeoutError("no acknowledgement of a batch within the publish timeout")
                if failed:
                    raise RuntimeError(f"a produce failed: {failed[0]}")
                settling.execute(PG_SETTLE, {"ids": ids, "token": token})

            return _overlapped(claim, settle, depth=depth)
    finally:
        stop.set()
        poller.join()
        producer.flush(1)


def l_steps_mysql(connect: Callable[[], Any], *, batch: int = BATCH, depth: int = DEPTH) -> dict[str, Any]:
    """Drain the outbox with the issue's two-step claim and the delete, on MySQL; events per second.

    ``connect`` opens a PyMySQL connection to the database (autocommit on)."""
    claiming, settling = connect(), connect()
    try:
        for conn in (claiming, settling):
            conn.autocommit(False)
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            conn.commit()

        def claim(after: int) -> tuple[list[int], str] | None:
            token = str(uuid.uuid4())
            with claiming.cursor() as cur:
                cur.execute(MYSQL_SELECT, (after, batch))
                ids = tuple(row[0] for row in cur.fetchall())
                if ids:
                    cur.execute(MYSQL_LEASE, (token, LEASE_SECONDS, ids))
                claiming.commit()
            return (list(ids), token) if ids else None

        def settle(ids: list[int], token: str) -> None:
            with settling.cursor() as cur:
                cur.execute(MYSQL_SETTLE, (tuple(ids), token))
            settling.commit()

        return _overlapped(claim, settle, depth=depth)
    finally:
        claiming.close()
        settling.close()


def l_keyed_steps_mysql(
    connect: Callable[[], Any], *, batch: int = BATCH, depth: int = DEPTH, seconds: float | None = None
) -> dict[str, Any]:
    """``l_steps_mysql`` with the least per-key check in its locking read (the module says which);
    events per second, over the first ``seconds`` of the drain if it takes longer (:func:`_overlapped`).
    ``connect`` opens a PyMySQL connection to the database (autocommit on)."""
    claiming, settling = connect(), connect()
    try:
        for conn in (claiming, settling):
            conn.autocommit(False)
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            conn.commit()
        floor = [0]  # every row at or below it is leased (or deleted)

        def claim(_after: int) -> tuple[list[int], str] | None:
            token = str(uuid.uuid4())
            with claiming.cursor() as cur:
                cur.execute(MYSQL_KEYED_SELECT, (floor[0], batch))
                rows = cur.fetchall()
                ids = tuple(row[0] for row in rows if row[-1])
                if ids:
                    cur.execute(MYSQL_LEASE, (token, LEASE_SECONDS, ids))
                claiming.commit()
            if not rows:  # every row past the floor is leased, and every row below it
                return None
            # The next claim reads again from the first row that failed the check (none: past the last row read).
            floor[0] = next((row[0] - 1 for row in rows if not row[-1]), rows[-1][0])
            return list(ids), token

        def settle(ids: list[int], token: str) -> None:
            with settling.cursor() as cur:
                cur.execute(MYSQL_SETTLE, (tuple(ids), token))
            settling.commit()

        return _overlapped(claim, settle, depth=depth, seconds=seconds)
    finally:
        claiming.close()
        settling.close()
