"""4: acknowledgements that come later than ``--publish-timeout`` for two minutes make a bounded number of copies.

The broker stores every message it is sent but its acknowledgements arrive
late (a stalled replica set, a slow disk): the fault proxy delays only what the
broker sends. Each timed-out batch goes back to the outbox and is published
again, and each time the broker stores it again. The copies are counted on the
broker and must stay under the bound docs/delivery.md derives:

    copies <= pipeline depth x (2 x batch size + ramp + window / (publish timeout + longest outage backoff))

(``ramp``: the timeouts before the outage backoff reaches its longest), which
holds when the relay halves its batch after each timeout and backs off between
timeouts as during an outage; a relay that just retries sends the whole batch
again every few seconds, for as long as the fault lasts.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter
from urllib.parse import urlsplit

import psycopg
import pytest

import producers
from relay.backoff import OUTAGE_BACKOFF_INITIAL_SECONDS, OUTAGE_BACKOFF_MAX_SECONDS
from tests.faults.conftest import FULL, Recorder
from tests.faults.proxy import FaultProxy
from tests.faults.test_network_faults import (
    RabbitCollector,
    RelayProcess,
    collect_kafka,
    drained,
    proxied_tansu,
    via_proxy,
    wait_for,
)
from tests.integration.kafka_support import unique_topic
from tests.relay_support import outbox_counts

#: Two minutes in the full suite (make faults); make test's quick run takes a shorter window, which the
#: bound follows (a relay that just retries still makes many times the bound's copies in it).
WINDOW_SECONDS = 120.0 if FULL else 45.0
PUBLISH_TIMEOUT_SECONDS = 1.0
#: Longer than the publish timeout, and short enough that the five round trips
#: of an AMQP handshake (and librdkafka's own requests) fit the connect timeout.
ACK_DELAY_SECONDS = 1.5
BATCH_SIZE = 100
PIPELINE_DEPTH = 2
EVENTS = 2_000
#: A batch holds one event per key: enough keys that every batch is full.
KEYS = 1_000

pytestmark = pytest.mark.timeout(600)
#: Long enough for every term a batch needs (claim, publish, RabbitMQ's close, settle): see RelaySettings.
LEASE_SECONDS = 15.0


def copies_bound(publish_timeout_seconds: float) -> int:
    """The most copies a ``WINDOW_SECONDS`` fault may cost (see docs/delivery.md)."""
    ramp = math.ceil(math.log2(OUTAGE_BACKOFF_MAX_SECONDS / OUTAGE_BACKOFF_INITIAL_SECONDS)) + 1
    slow = math.ceil(WINDOW_SECONDS / (publish_timeout_seconds + OUTAGE_BACKOFF_MAX_SECONDS))
    return PIPELINE_DEPTH * (2 * BATCH_SIZE + ramp + slow)


def write_backlog(database_url: str, topic: str) -> set[str]:
    keys = {f"late-{n}" for n in range(EVENTS)}
    with psycopg.connect(database_url) as conn:
        for n in range(EVENTS):
            producers.publish(conn, topic, {"key": f"k{n % KEYS}", "seq": n}, key=f"k{n % KEYS}",
                              idempotency_key=f"late-{n}")  # fmt: skip
    return keys


def relay_flags(publish_timeout_seconds: float) -> list[str]:
    return [
        "--batch-size", str(BATCH_SIZE), "--pipeline-depth", str(PIPELINE_DEPTH),
        "--publish-timeout", f"{publish_timeout_seconds:g}", "--lease-seconds", f"{LEASE_SECONDS:g}",
        "--max-attempts", "1000",
    ]  # fmt: skip


def sent(database_url: str) -> int:
    return EVENTS - sum(outbox_counts(database_url).values())


def late_acks(proxy: FaultProxy, database_url: str, delay_seconds: float) -> str:
    """Let the relay get going, delay the broker's answers for the window, then let it drain."""
    assert wait_for(lambda: sent(database_url) >= BATCH_SIZE, timeout=60) is not None, "the relay did not start"
    before = sent(database_url)
    proxy.latency(delay_seconds, direction="down")
    time.sleep(WINDOW_SECONDS)
    during = sent(database_url) - before
    proxy.passthrough()
    assert drained(database_url), outbox_counts(database_url)
    return f"{during} events settled during the {WINDOW_SECONDS:g} s of late acknowledgements"


def judge(record: Recorder, scenario: str, keys: set[str], received: list[str], bound: int, note: str) -> None:
    counts = Counter(received)
    copies = sum(counts.values()) - len(counts)
    lost = keys - set(counts)
    record(scenario, None, events=EVENTS, note=f"{note}; {copies} copies (bound {bound}), {len(lost)} lost")
    assert not lost, sorted(lost)[:10]
    assert copies <= bound, f"{copies} copies, more than the bound of {bound}: {note}"


def test_kafka_acknowledgements_late_for_two_minutes_make_bounded_copies(database_url: str, record: Recorder) -> None:
    topic = unique_topic("kafka-late-acks")
    keys = write_backlog(database_url, topic)
    with proxied_tansu() as (proxy, real_bootstrap):
        relay = RelayProcess(database_url, f"kafka://{proxy.address}", *relay_flags(PUBLISH_TIMEOUT_SECONDS))
        try:
            note = late_acks(proxy, database_url, ACK_DELAY_SECONDS)
        finally:
            assert relay.stop() == 0, "\n".join(relay.lines[-20:])
        received = [d.idempotency_key for d in collect_kafka(real_bootstrap, topic, keys)]
    judge(record, "4/timeouts: Kafka acknowledgements late for 2 minutes", keys, received,
          copies_bound(PUBLISH_TIMEOUT_SECONDS), note)  # fmt: skip


def test_rabbitmq_confirms_late_for_two_minutes_make_bounded_copies(
    database_url: str, amqp_url: str, record: Recorder
) -> None:
    queue = f"faults-late-confirms-{uuid.uuid4().hex[:12]}"
    broker = urlsplit(amqp_url)
    with (
        RabbitCollector(amqp_url, queue) as collector,
        FaultProxy(broker.hostname or "127.0.0.1", broker.port or 5672) as proxy,
    ):
        keys = write_backlog(database_url, queue)
        relay = RelayProcess(database_url, via_proxy(amqp_url, proxy), *relay_flags(PUBLISH_TIMEOUT_SECONDS))
        try:
            note = late_acks(proxy, database_url, ACK_DELAY_SECONDS)
        finally:
            assert relay.stop() == 0, "\n".join(relay.lines[-20:])
        wait_for(lambda: keys <= collector.keys(), timeout=60)
        time.sleep(1.0)
        received = [d.idempotency_key for d in collector.deliveries]
    assert collector.error is None, collector.error
    judge(record, "4/timeouts: RabbitMQ confirms late for 2 minutes", keys, received,
          copies_bound(PUBLISH_TIMEOUT_SECONDS), note)  # fmt: skip
