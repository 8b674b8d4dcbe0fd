"""The relay image at work against this machine's PostgreSQL, Tansu and RabbitMQ: ``migrate``,
``run`` to either broker, the admin commands, the declared health check and ``stop``."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
import yaml

from devservers import free_port
from tests.container.conftest import Containers, wait_for_healthz
from tests.container.engine import Engine
from tests.integration.kafka_support import consume
from tests.integration.rabbit_support import temp_queue
from tests.relay_support import wait_until

pytestmark = [pytest.mark.container, pytest.mark.timeout(180, func_only=True)]

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"
KEYS = ("order-1", "order-2", "order-3", None)


def stop_grace_seconds() -> float:
    """The relay service's ``stop_grace_period`` in the compose file: the drain time users are given."""
    grace = str(yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"]["relay"]["stop_grace_period"])
    assert grace.endswith("s") and grace[:-1].isdigit(), f"stop_grace_period {grace!r}: expected whole seconds"
    return float(grace[:-1])


def write_events(database_url: str, topic: str, committed: int, rolled_back: int) -> list[str]:
    """Commit ``committed`` events and roll back ``rolled_back`` others, in transactions of up to
    three, keyed round-robin; the committed events' idempotency keys in the order written."""
    kept: list[str] = []
    with psycopg.connect(database_url) as conn:
        for start in range(0, committed + rolled_back, 3):
            batch = [f"{topic}-{n}" for n in range(start, min(start + 3, committed + rolled_back))]
            for n, key in enumerate(batch, start):
                conn.execute(
                    "INSERT INTO outbox (topic, key, payload, idempotency_key) VALUES (%s, %s, %s, %s)",
                    [topic, KEYS[n % len(KEYS)], json.dumps({"n": n}), key],
                )
            # Every third transaction is rolled back, while rolled-back events remain to place.
            if (start // 3) % 3 == 2 and rolled_back > 0:
                conn.rollback()
                rolled_back -= len(batch)
            else:
                conn.commit()
                kept += batch
    return kept


def outbox_rows(database_url: str) -> int:
    """Rows left in the outbox (a delivered event's row is deleted)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox").fetchone()
    return int(row[0]) if row else 0


def key_order(written: list[str], received: list[str]) -> dict[str | None, tuple[list[str], list[str]]]:
    """Per key, the written and the received order of its events, where they differ."""
    key_of = {name: KEYS[int(name.rsplit("-", 1)[1]) % len(KEYS)] for name in written}
    differ: dict[str | None, tuple[list[str], list[str]]] = {}
    for key in KEYS:
        if key is None:
            continue
        sent = [name for name in written if key_of[name] == key]
        got = [name for name in received if key_of.get(name) == key]
        if sent != got:
            differ[key] = (sent, got)
    return differ


def migrated(containers: Containers, database_url: str) -> None:
    """``migrate`` from the image, twice (it is idempotent): the outbox table is there after."""
    for _ in range(2):
        done = containers.run("migrate", env={"RELAY_DATABASE_URL": database_url})
        assert done.returncode == 0, done.stderr
    assert outbox_rows(database_url) == 0


def relay_env(database_url: str, sink: str, port: int, **more: str) -> dict[str, str]:
    """The environment of a relay container, as a user would give it."""
    return {"RELAY_DATABASE_URL": database_url, "RELAY_SINK": sink, "RELAY_METRICS_PORT": str(port), **more}


def status(containers: Containers, database_url: str) -> dict[str, float]:
    """``status --json`` from the image."""
    done = containers.run("status", "--json", env={"RELAY_DATABASE_URL": database_url})
    assert done.returncode == 0, done.stderr
    found: dict[str, float] = json.loads(done.stdout)
    return found


def test_migrate_then_run_to_kafka_delivers_every_committed_event(
    containers: Containers, relay_database: str, kafka_bootstrap: str
) -> None:
    migrated(containers, relay_database)
    topic = f"container-{uuid.uuid4().hex[:12]}"
    written = write_events(relay_database, topic, committed=60, rolled_back=15)
    name = containers.start(env=relay_env(relay_database, f"kafka://{kafka_bootstrap}", free_port()))
    wait_until(lambda: outbox_rows(relay_database) == 0, timeout=60, interval=0.2)
    received = [m.headers["idempotency-key"].decode() for m in consume(kafka_bootstrap, topic, count=len(written))]
    assert Counter(received) == Counter(written), "every committed event once, no rolled-back one"
    assert key_order(written, received) == {}
    code, _ = containers.stop(name, stop_grace_seconds())
    assert code == 0


def test_migrate_then_run_to_rabbitmq_delivers_every_committed_event(
    containers: Containers, relay_database: str, amqp_url: str
) -> None:
    migrated(containers, relay_database)
    with temp_queue(amqp_url) as queue:
        written = write_events(relay_database, queue.name, committed=45, rolled_back=12)
        name = containers.start(env=relay_env(relay_database, amqp_url, free_port()))
        wait_until(lambda: outbox_rows(relay_database) == 0, timeout=60, interval=0.2)
        messages = queue.collect(len(written), timeout=30)
    received = [str(m.message_id) for m in messages]
    assert Counter(received) == Counter(written), "every committed event once, no rolled-back one"
    assert key_order(written, received) == {}
    assert all(m.content_type == "application/json" and m.delivery_mode == 2 for m in messages)
    code, _ = containers.stop(name, stop_grace_seconds())
    assert code == 0


def test_status_dead_and_requeue_from_the_image(containers: Containers, relay_database: str, amqp_url: str) -> None:
    migrated(containers, relay_database)
    topic = f"container-unrouted-{uuid.uuid4().hex[:12]}"
    written = write_events(relay_database, topic, committed=2, rolled_back=0)
    # No queue receives the topic yet: each event fails once and is dead-lettered.
    env = relay_env(relay_database, amqp_url, free_port(), RELAY_MAX_ATTEMPTS="1")
    containers.start(env=env)
    wait_until(lambda: status(containers, relay_database)["failed"] == 2, timeout=60, interval=0.5)
    counts = status(containers, relay_database)
    assert (counts["pending"], counts["in_flight"], counts["oldest_pending_age_seconds"]) == (0, 0, 0)

    dead = containers.run("dead", "--json", env={"RELAY_DATABASE_URL": relay_database})
    assert dead.returncode == 0, dead.stderr
    listed = json.loads(dead.stdout)
    assert sorted(event["idempotency_key"] for event in listed) == sorted(written)
    assert all(event["last_error"] and event["attempts"] == 1 for event in listed), listed
    text = containers.run("dead", env={"RELAY_DATABASE_URL": relay_database})
    assert text.returncode == 0 and topic in text.stdout, text

    # A queue for the topic now: requeued, the events arrive.
    with temp_queue(amqp_url, name=topic) as queue:
        first = min(event["id"] for event in listed)
        requeued = containers.run("requeue", "--id", str(first), env={"RELAY_DATABASE_URL": relay_database})
        assert requeued.returncode == 0, requeued.stderr
        wait_until(lambda: status(containers, relay_database)["failed"] == 1, timeout=60, interval=0.5)
        requeued = containers.run("requeue", "--topic", topic, env={"RELAY_DATABASE_URL": relay_database})
        assert requeued.returncode == 0, requeued.stderr
        wait_until(lambda: outbox_rows(relay_database) == 0, timeout=60, interval=0.5)
        delivered = sorted(str(m.message_id) for m in queue.collect(2))
    assert delivered == sorted(written)
    counts = status(containers, relay_database)
    assert (counts["failed"], counts["pending"], counts["in_flight"], counts["oldest_pending_age_seconds"]) == (
        0, 0, 0, 0,
    )  # fmt: skip


def test_the_declared_health_check_passes_on_a_relay_and_fails_without_one(
    engine: Engine, image: str, containers: Containers, relay_database: str, amqp_url: str
) -> None:
    migrated(containers, relay_database)
    # Not the image's default port: the check must follow RELAY_METRICS_PORT as the relay does.
    port = free_port()
    relay = containers.start(env=relay_env(relay_database, amqp_url, port))
    wait_for_healthz(port)
    check = engine.health_check(relay)
    assert check.returncode == 0, (check.stdout, check.stderr)
    # The same image with nothing serving /healthz: the check must say so.
    idle = containers.start(
        "-c", "import time; time.sleep(120)",
        env={"RELAY_METRICS_PORT": str(free_port())}, options=("--entrypoint", "python"),
    )  # fmt: skip
    check = engine.health_check(idle)
    assert check.returncode != 0, "the health check passed with no relay running"


def test_stop_drains_within_the_grace_period_and_loses_nothing(
    containers: Containers, relay_database: str, kafka_bootstrap: str
) -> None:
    migrated(containers, relay_database)
    topic = f"container-stop-{uuid.uuid4().hex[:12]}"
    events = 20_000
    with psycopg.connect(relay_database) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, idempotency_key)"
            " SELECT %s, 'k' || (g %% 300), jsonb_build_object('n', g), 'e' || g FROM generate_series(1, %s) g",
            [topic, events],
        )
    # Small batches, so that the stop finds batches in hand and events still pending.
    env = relay_env(relay_database, f"kafka://{kafka_bootstrap}", free_port(), RELAY_BATCH_SIZE="200")
    grace = stop_grace_seconds()
    name = containers.start(env=env)
    wait_until(lambda: outbox_rows(relay_database) < events - 500, timeout=60, interval=0.05)
    code, took = containers.stop(name, grace)
    assert code == 0, f"exit {code} after {took:.1f} s (137: killed when the grace period of {grace:.0f} s ran out)"
    assert took < grace
    left = status(containers, relay_database)
    assert left["in_flight"] == 0, "a graceful stop settles or releases the batches in hand"
    assert left["pending"] > 0, "stopped under load: something should be left to prove the restart"
    again = containers.start(env=env)
    wait_until(lambda: outbox_rows(relay_database) == 0, timeout=120, interval=0.2)
    assert containers.stop(again, grace)[0] == 0
    seen = Counter(m.headers["idempotency-key"] for m in consume(kafka_bootstrap, topic, count=events, timeout=60))
    assert set(seen) == {f"e{i}".encode() for i in range(1, events + 1)}, "nothing lost"
    assert sum(seen.values()) == events, "a graceful stop sends nothing twice"
