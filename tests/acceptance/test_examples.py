"""compose's example shop and consumer, run as compose runs them, against PostgreSQL and Tansu.

Each service's command line and environment come from
``compose/docker-compose.yml``; only what names a compose host (the database
URL, the Kafka URL), the heartbeat files, the topic and the group are pointed
at this test's own, and the shop runs faster than in compose to be done in
seconds. The relay in between is ``outbox-relay run`` keeping sent events, so
the outbox ends up holding exactly the events whose transactions committed.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest
import yaml

from examples.shop import STEPS
from tests.acceptance.cli import env as clean_env
from tests.relay_support import relay_process, stop_process, wait_until

COMPOSE_FILE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"
SHOP_SECONDS = 2.5
# compose's 2 a second would place about 5 orders here; enough steps are needed
# for some to be rolled back.
TEST_ORDERS_PER_SECOND = "20"
WAIT_SECONDS = 20.0


def compose_service(name: str) -> dict[str, Any]:
    """One service of the compose file."""
    service: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))["services"][name]
    return service


def argv_of(service: dict[str, Any]) -> list[str]:
    """The service's entry point and command, with ``python`` being this interpreter."""
    words = [str(word) for word in [*service["entrypoint"], *service["command"]]]
    return [sys.executable if word == "python" else word for word in words]


class Service:
    """A compose service as a subprocess, its stderr in a file."""

    def __init__(self, name: str, log: Path, **overrides: str) -> None:
        service = compose_service(name)
        environment = {str(k): str(v) for k, v in service["environment"].items()}
        unknown = set(overrides) - set(environment) - {"SHOP_TOPIC", "CONSUMER_TOPIC"}
        assert not unknown, f"{name}: compose sets no {sorted(unknown)}"
        # The same variables compose sets, and nothing inherited that the service might read.
        base = {k: v for k, v in clean_env().items() if not k.startswith(("SHOP_", "CONSUMER_"))}
        self.log = log
        self._stderr: IO[bytes] = log.open("wb")
        self.process = subprocess.Popen(
            argv_of(service),
            env={**base, **environment, **overrides},
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=subprocess.STDOUT,
        )

    def text(self) -> str:
        """What it logged so far."""
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM, then its exit code (killed after ``timeout``)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._stderr.close()


def actions(log: str, action: str) -> int:
    """How many lines of a text log carry ``[action=ACTION]``."""
    return log.count(f"[action={action}]")


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


@pytest.mark.timeout(60)
def test_shop_relay_and_consumer_process_every_committed_order_once(
    database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    kafka = f"kafka://{kafka_bootstrap}"
    topic = f"shop.orders.{uuid.uuid4().hex[:8]}"
    consumer_heartbeat = tmp_path / "consumer.heartbeat"
    started: list[Service] = []
    relay = None
    try:
        consumer = Service(
            "consumer",
            tmp_path / "consumer.log",
            CONSUMER_DATABASE_URL=database_url,
            CONSUMER_KAFKA=kafka,
            CONSUMER_TOPIC=topic,
            CONSUMER_GROUP=f"test-{uuid.uuid4().hex[:8]}",
            CONSUMER_HEARTBEAT_FILE=str(consumer_heartbeat),
        )
        started.append(consumer)
        # The heartbeat starts once the tables and the topic exist.
        wait_until(lambda: consumer_heartbeat.exists() or consumer.process.poll() is not None, timeout=WAIT_SECONDS)
        assert consumer.process.poll() is None, consumer.text()

        relay = relay_process(database_url, kafka, "--keep-sent")
        shop = Service(
            "shop",
            tmp_path / "shop.log",
            SHOP_DATABASE_URL=database_url,
            SHOP_TOPIC=topic,
            SHOP_ORDERS_PER_SECOND=TEST_ORDERS_PER_SECOND,
            SHOP_HEARTBEAT_FILE=str(tmp_path / "shop.heartbeat"),
        )
        started.append(shop)
        time.sleep(SHOP_SECONDS)
        assert shop.process.poll() is None, shop.text()
        assert (tmp_path / "shop.heartbeat").exists(), "the shop never touched its heartbeat"
        assert shop.stop() == 0, shop.text()
        assert not (tmp_path / "shop.heartbeat").exists(), "a stopped shop left its heartbeat"
        tally = re.search(r"shop closed: (\d+) events committed, (\d+) rolled back", shop.text())
        assert tally, shop.text()
        committed, rolled_back = int(tally.group(1)), int(tally.group(2))
        assert committed > 0 and rolled_back > 0, shop.text()

        # Every committed event is in the outbox (kept once sent); rolled-back ones never are.
        keys = {row[0] for row in query(database_url, "SELECT idempotency_key FROM outbox")}
        assert len(keys) == committed
        wait_until(lambda: query(database_url, "SELECT count(*) FROM outbox WHERE state <> 'sent'")[0][0] == 0)
        wait_until(
            lambda: actions(consumer.text(), "consumer_processed") >= committed or consumer.process.poll() is not None,
            timeout=WAIT_SECONDS,
        )
        assert consumer.stop() == 0, consumer.text()
        assert not consumer_heartbeat.exists(), "a stopped consumer left its heartbeat"

        processed = Counter(row[0] for row in query(database_url, "SELECT idempotency_key FROM consumer_order_events"))
        assert set(processed) == keys, "processed events differ from the committed ones"
        assert set(processed.values()) == {1}, "an event was processed twice"
        assert {row[0] for row in query(database_url, "SELECT idempotency_key FROM inbox")} == keys

        # Each order's processed events are exactly the steps it committed, one each.
        events: dict[str, list[str]] = defaultdict(list)
        for order_id, event_type in query(database_url, "SELECT order_id, event_type FROM consumer_order_events"):
            events[order_id].append(event_type)
        statuses = dict(query(database_url, "SELECT id, status FROM outbox_demo_orders"))
        assert set(events) == set(statuses)
        for order_id, status in statuses.items():
            done = STEPS[: STEPS.index(f"order.{status}") + 1]
            assert sorted(events[order_id]) == sorted(done), (order_id, status, events[order_id])

        # A new group reads everything again: the inbox makes every redelivery a no-op.
        again = Service(
            "consumer",
            tmp_path / "again.log",
            CONSUMER_DATABASE_URL=database_url,
            CONSUMER_KAFKA=kafka,
            CONSUMER_TOPIC=topic,
            CONSUMER_GROUP=f"test-again-{uuid.uuid4().hex[:8]}",
            CONSUMER_HEARTBEAT_FILE=str(tmp_path / "again.heartbeat"),
        )
        started.append(again)
        wait_until(
            lambda: actions(again.text(), "consumer_duplicate") >= committed or again.process.poll() is not None,
            timeout=WAIT_SECONDS,
        )
        assert again.stop() == 0, again.text()
        assert actions(again.text(), "consumer_processed") == 0, again.text()
        assert actions(again.text(), "consumer_duplicate") == committed, again.text()
        assert query(database_url, "SELECT count(*) FROM consumer_order_events")[0][0] == committed
    finally:
        for service in started:
            service.stop(timeout=5)
        if relay is not None:
            assert stop_process(relay) == 0


def test_the_services_stop_with_a_one_line_error_on_bad_configuration(tmp_path: Path) -> None:
    env = {k: v for k, v in clean_env().items() if not k.startswith(("SHOP_", "CONSUMER_"))}
    for command, extra, expected in [
        ("shop", {"SHOP_DATABASE_URL": "mysql://app:Secret-pw@db/shop"}, "unknown database URL scheme"),
        ("shop", {"SHOP_FAILURE_RATE": "1.5"}, "SHOP_FAILURE_RATE"),
        ("consumer", {"CONSUMER_DATABASE_URL": "postgresql://app@127.0.0.1/x"}, "no Kafka configured"),
        (
            "consumer",
            {"CONSUMER_DATABASE_URL": "postgresql://app@127.0.0.1/x", "CONSUMER_KAFKA": "amqp://rabbit/"},
            "must be a kafka:// URL",
        ),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "examples.services", command],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, (command, extra, result.stderr)
        assert expected in result.stderr, (command, extra, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Secret-pw" not in result.stderr
