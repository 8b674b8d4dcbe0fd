"""The servers a run uses: throwaway databases, topics and queues, and the machine's facts.

Every database is ``bench_<run>_<name>`` and every topic or queue
``bench.<run>.<name>``; :class:`Cleanup` removes all of them at the end,
also after an error or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import psycopg
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql

from relay.config import NATIVE, TableLayout, TableName
from relay.store.migrate import migrate

PG_URL = os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
TABLE = TableName.parse("outbox")
KAFKA_PARTITIONS = 4
ADMIN_TIMEOUT_SECONDS = 30.0
DISTINCT_KEYS = 50_000

# ~200 bytes of JSON per event, keyed by aggregate: 'order-' || (g % 50000).
#: The seeded events: one row each of topic, key, payload and headers.
EVENTS_SQL = """
SELECT %(topic)s AS topic,
       CASE WHEN %(keyed)s THEN 'order-' || (g %% {keys}) END AS key,
       jsonb_build_object(
           'event', 'order.created', 'order_id', g, 'customer_id', 'customer-' || (g %% 9973),
           'amount_cents', (g * 7919) %% 100000, 'currency', 'EUR', 'items', (g %% 5) + 1,
           'channel', 'web', 'created_at', '2024-05-01T12:00:00Z', 'status', 'new') AS payload,
       '{{}}'::jsonb AS headers
FROM generate_series(1, %(n)s::bigint) AS g  -- bigint: g * 7919 passes 2^31 from g = 271,189
"""
SEED_SQL = "INSERT INTO outbox (topic, key, payload, headers)" + EVENTS_SQL
#: The same events as bytes payloads (their JSON text, so each is as large), issue 18.
SEED_BYTES_SQL = (
    "INSERT INTO outbox (topic, key, payload_bytes, content_type, headers)"
    " SELECT topic, key, convert_to(payload::text, 'UTF8'), 'application/octet-stream', headers"
    " FROM (" + EVENTS_SQL + ") AS e"
)
#: The same events in Debezium's outbox table, issue 18: the relay reads it with
#: --table-layout debezium and --topic-template {aggregatetype}, so the topics are the same.
SEED_DEBEZIUM_SQL = (
    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)"
    " SELECT gen_random_uuid(), topic, key, 'order.created', payload"
    " FROM (" + EVENTS_SQL + ") AS e"
)

BUSINESS_SQL = """
CREATE TABLE IF NOT EXISTS business (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer text NOT NULL,
    amount_cents integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


def document_for(g: int) -> dict[str, Any]:
    """The Python twin of the seeded payload (same fields, same size)."""
    return {
        "event": "order.created",
        "order_id": g,
        "customer_id": f"customer-{g % 9973}",
        "amount_cents": (g * 7919) % 100000,
        "currency": "EUR",
        "items": (g % 5) + 1,
        "channel": "web",
        "created_at": "2024-05-01T12:00:00Z",
        "status": "new",
    }


def payload_for(g: int) -> bytes:
    """:func:`document_for` as JSON bytes, for the broker baselines."""
    return json.dumps(document_for(g)).encode()


def url_for(database: str, base: str = PG_URL) -> str:
    """``base`` pointing at ``database``."""
    info = psycopg.conninfo.conninfo_to_dict(base)
    info["dbname"] = database
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})


class Cleanup:
    """Names the run's databases, topics and queues and removes them at the end."""

    def __init__(self, kafka_bootstrap: Callable[[], str | None]) -> None:
        self.run = uuid.uuid4().hex[:8]
        self._kafka_bootstrap = kafka_bootstrap
        self.databases: list[str] = []
        self.topics: list[str] = []
        self.queues: list[str] = []

    def database_name(self, name: str) -> str:
        return f"bench_{self.run}_{name}"

    def topic_name(self, name: str) -> str:
        return f"bench.{self.run}.{name}"

    # -- databases -------------------------------------------------------

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create ``bench_<run>_<name>`` (a copy of ``template`` if given); return its URL."""
        full = self.database_name(name)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(full)))
            if template is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(full)))
            else:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                        sql.Identifier(full), sql.Identifier(self.database_name(template))
                    )
                )
        self.databases.append(full)
        return url_for(full)

    def drop_database(self, name: str) -> None:
        full = self.database_name(name)
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(full)))
        with contextlib.suppress(ValueError):
            self.databases.remove(full)

    # -- topics and queues -----------------------------------------------

    def create_topic(self, name: str, partitions: int = KAFKA_PARTITIONS) -> str:
        """A new Kafka topic ``bench.<run>.<name>``."""
        bootstrap = self._kafka_bootstrap()
        assert bootstrap is not None, "no Kafka broker started"
        topic = self.topic_name(name)
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
        futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        futures[topic].result(ADMIN_TIMEOUT_SECONDS)
        self.topics.append(topic)
        return topic

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` now, freeing the broker's memory (Tansu keeps it all in memory)."""
        bootstrap = self._kafka_bootstrap()
        if bootstrap:
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
            admin.delete_topics([topic], operation_timeout=10)[topic].result(ADMIN_TIMEOUT_SECONDS)
        with contextlib.suppress(ValueError):
            self.topics.remove(topic)

    def create_queue(self, name: str) -> str:
        """A new durable RabbitMQ queue ``bench.<run>.<name>`` (bound to the default exchange)."""
        queue = self.topic_name(name)
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(AMQP_URL))) as connection:
            connection.channel().queue_declare(queue, durable=True)
        self.queues.append(queue)
        return queue

    def delete_queue(self, queue: str) -> None:
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(AMQP_URL))) as connection:
            connection.channel().queue_delete(queue)
        with contextlib.suppress(ValueError):
            self.queues.remove(queue)

    def close(self) -> list[str]:
        """Remove everything still recorded; return what could not be removed."""
        problems: list[str] = []
        for full in list(self.databases):
            try:
                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(full)))
            except psycopg.Error as exc:
                problems.append(f"database {full}: {exc}")
        self.databases.clear()
        for queue in list(self.queues):
            try:
                self.delete_queue(queue)
            except pika.exceptions.AMQPError as exc:
                problems.append(f"queue {queue}: {exc!r}")
        self.queues.clear()
        bootstrap = self._kafka_bootstrap()
        if self.topics and bootstrap:
            admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
            for topic, future in admin.delete_topics(list(self.topics), operation_timeout=10).items():
                try:
                    future.result(ADMIN_TIMEOUT_SECONDS)
                except Exception as exc:  # noqa: BLE001 - a broker that is going away anyway
                    problems.append(f"topic {topic}: {exc}")
        self.topics.clear()
        return problems


def prepare_template(
    cleanup: Cleanup, name: str, *, events: int, topic: str, keyed: bool, payloads: str = "json"
) -> str:
    """A migrated database holding ``events`` outbox rows and a ``business`` table; its URL.

    It is vacuumed and analysed, then used only as a template, so every copy
    starts from the same rows and the same statistics. ``payloads``: ``json``,
    ``bytes`` (the same events as bytes), or ``debezium`` (the same events in
    a Debezium outbox table, keyed).
    """
    url = cleanup.create_database(name)
    migrate(url, TABLE, layout=TableLayout.parse("debezium") if payloads == "debezium" else NATIVE)
    seed = {"json": SEED_SQL, "bytes": SEED_BYTES_SQL, "debezium": SEED_DEBEZIUM_SQL}[payloads]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(BUSINESS_SQL)
        if events:
            conn.execute(
                sql.SQL(seed).format(keys=sql.Literal(DISTINCT_KEYS)),
                {"topic": topic, "keyed": keyed, "n": events},
            )
        conn.execute("VACUUM (ANALYZE) outbox")
    return url


def require_postgres() -> None:
    """Fail with how to fix it unless PostgreSQL answers and lets us create databases."""
    try:
        with psycopg.connect(PG_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        raise SystemExit(
            f"PostgreSQL is not reachable ({' '.join(str(exc).split())[:200]}). Start it with "
            "`python -m tests.services --ensure`, or point BENCH_DATABASE_URL at a server "
            "where this user may CREATE DATABASE."
        ) from None


def require_rabbitmq() -> None:
    """Raise with how to fix it unless RabbitMQ accepts a connection."""
    try:
        pika.BlockingConnection(pika.URLParameters(AMQP_URL)).close()
    except pika.exceptions.AMQPError as exc:
        raise RuntimeError(
            f"RabbitMQ is not reachable ({exc!r}). Start it with `python -m tests.services --ensure`, "
            "or point BENCH_AMQP_URL at a broker."
        ) from None


def source_state() -> str:
    """The commit the relay was measured at, and whether the tree had changes on top of it.

    ``BENCH_SOURCE`` overrides it, for a run from an exported tree without git.
    """
    if os.environ.get("BENCH_SOURCE"):
        return os.environ["BENCH_SOURCE"]
    root = Path(__file__).parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "relay", "producers"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit} with local changes to relay/ or producers/" if dirty else commit


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare runs: cores, memory, CPU, kernel, PostgreSQL."""
    memory_kb = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory_kb = int(line.split()[1])
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with psycopg.connect(PG_URL) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name IN"
                " ('synchronous_commit', 'fsync', 'shared_buffers', 'max_connections')"
            ).fetchall()
        )
    try:
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(AMQP_URL))) as connection:
            rabbit = connection._impl.server_properties.get("version", b"?")  # type: ignore[attr-defined]
    except pika.exceptions.AMQPError:
        rabbit = "unreachable"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "source": source_state(),
        "nproc": os.cpu_count(),
        "memory_gb": round(memory_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": row[0] if row else "?",
        "postgresql_settings": settings,
        "rabbitmq": rabbit.decode() if isinstance(rabbit, bytes) else str(rabbit),
    }
