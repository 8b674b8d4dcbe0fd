"""RabbitMQ faults under load: connections closed, the broker app stopped, a memory alarm.

The relay must neither hang past its publish timeout nor mark anything sent
that the broker did not confirm, and must deliver once the broker is back.

These tests drive the machine's shared RabbitMQ with ``rabbitmqctl``: every
client of that broker sees the faults while they last. Whatever happens, the
broker is put back as it was (app started, memory watermark restored, test
queues deleted).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
import psycopg
import pytest

import producers
from tests.faults.checker import Delivery, Ledger, Watcher, Writers, verdict
from tests.faults.conftest import FULL, Recorder
from tests.faults.schedule import FaultSchedule
from tests.faults.test_process_faults import Tapped, unsettled
from tests.integration.rabbit_support import unique_name
from tests.relay_support import outbox_counts, relay_process, wait_until

PUBLISH_TIMEOUT_SECONDS = 3.0
LEASE_SECONDS = 15.0
EVENTS = 24_000 if FULL else 6_000
ROUNDS = 3 if FULL else 1
#: How long a claimed batch may stay in hand: the publish timeout, plus the
#: settle and a scheduling margin on a busy machine.
HOLD_BOUND_SECONDS = PUBLISH_TIMEOUT_SECONDS + 2.0
#: How long the relay may take to deliver again once the broker is back:
#: its reconnect backoff tops out at 10 s.
RECOVERY_SECONDS = 40.0
ALARM_WATERMARK = "0.0000001"
BLOCKED = "RabbitMQ blocks publishing"


# --- the broker ----------------------------------------------------------------


def rabbitmqctl(*args: str, timeout: float = 120) -> str:
    """Run ``rabbitmqctl ARGS`` and return its output; raise if it fails."""
    done = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=timeout, check=False
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def memory_watermark() -> list[str]:
    """The current watermark as ``set_vm_memory_high_watermark`` arguments."""
    value = rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().")
    if value.startswith("{absolute,"):
        return ["absolute", value.removeprefix("{absolute,").rstrip("}").strip().strip('"')]
    float(value)  # a fraction such as 0.4; anything else is a surprise worth failing on
    return [value]


def alarms() -> str:
    return rabbitmqctl("eval", "rabbit_alarm:get_alarms().")


@contextlib.contextmanager
def durable_queue(amqp_url: str) -> Iterator[str]:
    """A durable queue that outlives connection losses and a broker restart; deleted on exit."""
    name = unique_name("relay-faults")
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(amqp_url))) as conn:
        conn.channel().queue_declare(name, durable=True)
    try:
        yield name
    finally:
        deadline = time.monotonic() + 60
        while True:
            try:
                with contextlib.closing(pika.BlockingConnection(pika.URLParameters(amqp_url))) as conn:
                    conn.channel().queue_delete(name)
                break
            except pika.exceptions.AMQPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)


def queue_depth(amqp_url: str, queue: str) -> int:
    """Messages ready in ``queue``; -1 while the broker cannot be reached."""
    try:
        with contextlib.closing(pika.BlockingConnection(pika.URLParameters(amqp_url))) as conn:
            return int(conn.channel().queue_declare(queue, passive=True).method.message_count or 0)
    except pika.exceptions.AMQPError:
        return -1


def drain_queue(amqp_url: str, queue: str, expected: int, timeout: float = 120) -> list[dict[str, Any]]:
    """Take every message of ``queue`` (at least ``expected``, or until ``timeout``)."""
    taken: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    with contextlib.closing(pika.BlockingConnection(pika.URLParameters(amqp_url))) as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=1000)
        for method, properties, body in channel.consume(queue, auto_ack=True, inactivity_timeout=1.0):
            if method is None or properties is None:
                if len(taken) >= expected or time.monotonic() > deadline:
                    break
                continue
            headers = {
                k: v.decode() if isinstance(v, bytes) else v for k, v in (properties.headers or {}).items()
            }  # fmt: skip
            taken.append(
                {
                    "routing_key": method.routing_key,
                    "message_id": properties.message_id,
                    "headers": headers,
                    "body": body,
                }
            )
        channel.cancel()
    return taken


def deliveries(messages: list[dict[str, Any]]) -> list[Delivery]:
    out = []
    for m in messages:
        body = json.loads(m["body"])
        out.append(Delivery(m["message_id"], body.get("key"), int(body.get("seq", -1))))
    return out


# --- watching the relay from the database --------------------------------------


class HoldWatch(Watcher):
    """Samples, from the table, how long the oldest live lease has been held."""

    def __init__(self, database_url: str, lease_seconds: float) -> None:
        self.database_url = database_url
        self.lease_seconds = lease_seconds
        self.worst = 0.0
        self.samples = 0
        super().__init__()

    def _run(self) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - lease_expires_at)), -1e9)::float8"
                    " FROM outbox WHERE state = 'pending' AND lease_expires_at > clock_timestamp()"
                ).fetchone()
                if row is not None and row[0] > -1e8:
                    self.worst = max(self.worst, row[0] + self.lease_seconds)
                self.samples += 1
                time.sleep(0.1)


# --- the scenario -------------------------------------------------------------


def burst(database_url: str, queue: str, ledger: Ledger, key: str, n: int = 50) -> None:
    """``n`` committed events of one key, so a recovery has something to deliver."""
    with psycopg.connect(database_url) as conn, conn.transaction():
        written = [(producers.publish(conn, queue, {"key": key, "seq": i}, key=key), i) for i in range(1, n + 1)]
    with ledger.lock:
        ledger.committed.update({idem: (key, seq) for idem, seq in written})


def wait_for_growth(amqp_url: str, queue: str, timeout: float) -> float:
    """Seconds until ``queue`` receives more messages; fails after ``timeout``."""
    started = time.monotonic()
    base = -1
    while base < 0:
        base = queue_depth(amqp_url, queue)
        if time.monotonic() - started > timeout:
            raise AssertionError("the broker did not come back")
        time.sleep(0.2)
    wait_until(lambda: queue_depth(amqp_url, queue) > base, timeout=max(1.0, timeout - (time.monotonic() - started)))
    return time.monotonic() - started


@pytest.mark.timeout(900 if FULL else 300)
def test_connections_closed_app_restarted_and_memory_alarm_under_load(
    database_url: str, amqp_url: str, record: Recorder
) -> None:
    original_watermark = memory_watermark()
    assert alarms() == "[]", "the broker already has an alarm; not adding faults to it"
    recoveries: dict[str, list[float]] = {"close_all_connections": [], "stop_app/start_app": [], "memory alarm": []}
    codes: list[int] = []
    app_stopped = False
    with durable_queue(amqp_url) as queue:
        relay = Tapped(
            relay_process(
                database_url, amqp_url, "--publish-timeout", str(PUBLISH_TIMEOUT_SECONDS), "--lease-seconds",
                str(LEASE_SECONDS), "--max-attempts", "50",
            )
        )  # fmt: skip
        # Paced to write EVENTS in about 35 s a round; the schedule keeps them writing through every fault.
        pause = (35.0 * ROUNDS) / (EVENTS / 8 / 3)
        writers = Writers(database_url, queue, count=8, events=EVENTS, keys_per_writer=25, pause=pause)
        try:
            with HoldWatch(database_url, LEASE_SECONDS) as watch:
                with FaultSchedule(writers) as schedule:
                    wait_for_growth(amqp_url, queue, 30)
                    for round_ in range(ROUNDS):
                        with schedule.fault(f"close_all_connections #{round_ + 1}"):
                            rabbitmqctl(
                                "close_all_connections", "--vhost", "/", "--limit", "10000", "test: connections"
                            )
                            burst(database_url, queue, writers.ledger, f"close-{round_}")
                            recoveries["close_all_connections"].append(
                                wait_for_growth(amqp_url, queue, RECOVERY_SECONDS)
                            )

                        with schedule.fault(f"stop_app #{round_ + 1}"):
                            app_stopped = True
                            try:
                                rabbitmqctl("stop_app")
                                burst(database_url, queue, writers.ledger, f"stopped-{round_}")
                                time.sleep(PUBLISH_TIMEOUT_SECONDS)
                            finally:
                                rabbitmqctl("start_app")
                                app_stopped = False
                        recoveries["stop_app/start_app"].append(wait_for_growth(amqp_url, queue, RECOVERY_SECONDS))

                        with schedule.fault(f"memory alarm #{round_ + 1}"):
                            try:
                                blocked_before = relay.text().count(BLOCKED)
                                rabbitmqctl("set_vm_memory_high_watermark", ALARM_WATERMARK)
                                # The relay learns of the alarm from the broker (connection.blocked).
                                wait_until(
                                    lambda n=blocked_before: relay.text().count(BLOCKED) > n, timeout=30, interval=0.1
                                )
                                held_depth = queue_depth(amqp_url, queue)
                                burst(database_url, queue, writers.ledger, f"alarm-{round_}")
                                time.sleep(2 * PUBLISH_TIMEOUT_SECONDS)
                                # Blocked: nothing can have been confirmed, so nothing was added.
                                assert queue_depth(amqp_url, queue) == held_depth
                                assert relay.proc.poll() is None, relay.text()
                            finally:
                                rabbitmqctl("set_vm_memory_high_watermark", *original_watermark)
                        recoveries["memory alarm"].append(wait_for_growth(amqp_url, queue, RECOVERY_SECONDS))
                wait_until(lambda: unsettled(database_url) == 0, timeout=120)
            counts = outbox_counts(database_url)
            committed = len(writers.ledger.committed)
            messages = drain_queue(amqp_url, queue, committed)
        finally:
            try:
                codes = [relay.stop()]
            finally:
                # Put the shared broker back, whatever happened above.
                if app_stopped:
                    rabbitmqctl("start_app")
                restored_watermark = memory_watermark()
                if restored_watermark != original_watermark:
                    rabbitmqctl("set_vm_memory_high_watermark", *original_watermark)
                    restored_watermark = memory_watermark()
    result = verdict(writers.ledger, deliveries(messages))
    log = relay.text()
    seen = {
        "connection lost": log.count("lost the RabbitMQ connection"),
        "batches cut between publish and confirm": log.count("before any confirm") + log.count("unconfirmed"),
        "blocked": log.count(BLOCKED),
        "released": log.count("broker unavailable, releasing"),
        "pika ERROR lines": sum(1 for line in log.splitlines() if " ERROR pika." in line),
    }
    recovered = ", ".join(f"{k} {max(v):.1f}s" for k, v in recoveries.items())
    note = (
        f"{ROUNDS} round(s) of close_all_connections, stop_app/start_app, memory alarm; longest hold of a "
        f"claimed batch {watch.worst:.1f}s (publish timeout {PUBLISH_TIMEOUT_SECONDS:g}s); back to delivering "
        f"after: {recovered}; relay log: {seen}; {schedule.note()}"
    )
    print(f"rabbitmq faults: {note}; {result}")
    record("7/rabbitmq: connections closed, app restarted, memory alarm, under load", result, runs=ROUNDS, note=note)
    assert restored_watermark == original_watermark
    assert alarms() == "[]"
    assert codes == [0], log
    # pika logs its own tracebacks for a reset socket; none may come through relay code.
    assert not re.search(r'File "[^"]*/relay/', log), log
    assert not schedule.unloaded(), note
    assert counts.get("failed", 0) == 0, "nothing was dead-lettered"
    assert result.lost == result.leaked == result.unexpected == 0, str(result)
    assert result.order_violations == 0, str(result)
    assert watch.samples > 100
    assert watch.worst <= HOLD_BOUND_SECONDS, f"a batch was held {watch.worst:.1f}s, past the publish timeout"
