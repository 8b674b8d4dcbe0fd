"""/healthz during a long database outage: a relay waiting it out is alive, and resumes by itself.

The relay (a subprocess, with ``--metrics-port``) reaches PostgreSQL through
the fault proxy. Once it is busy with a backlog (its pipeline full), the
proxy black-holes the database link for half the outage (calls hang until the
relay's own deadlines end them), then resets every connection for the other
half (the server refuses). A probe polls ``/healthz`` throughout, as a
container's liveness probe would: a relay that answered 503 would be
restarted for nothing. Quick by default (30 s); RELAY_FAULTS_FULL=1 runs the
2-minute outage.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import psycopg
import pytest

from tests.faults.checker import KafkaCollector, Watcher, Writers
from tests.faults.conftest import FULL, Recorder
from tests.faults.proxy import FaultProxy
from tests.faults.test_database_faults import unsent_keys, via
from tests.faults.test_process_faults import Tapped
from tests.integration.kafka_support import unique_topic
from tests.relay_support import outbox_counts, relay_process, wait_until

OUTAGE_SECONDS = 120.0 if FULL else 30.0
EVENTS = 40_000 if FULL else 20_000
PROBE_INTERVAL_SECONDS = 0.25


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class HealthProbe(Watcher):
    """Polls ``/healthz`` like a liveness probe; keeps (monotonic time, status) of every answer."""

    join_seconds = 10.0

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/healthz"
        self.answers: list[tuple[float, int | None]] = []
        self._lock = threading.Lock()
        super().__init__()

    def status(self) -> int | None:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None

    def _run(self) -> None:
        while not self._stop.wait(PROBE_INTERVAL_SECONDS):
            answer = (time.monotonic(), self.status())
            with self._lock:
                self.answers.append(answer)

    def between(self, start: float, end: float) -> list[tuple[float, int | None]]:
        with self._lock:
            return [(at, status) for at, status in self.answers if start <= at <= end]


@pytest.mark.slow
@pytest.mark.timeout(900 if FULL else 400)
def test_healthz_stays_200_through_a_database_outage_with_a_full_pipeline(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    port, topic = free_port(), unique_topic("liveness")
    writers = Writers(database_url, topic, count=4, events=EVENTS, keys_per_writer=50)
    writers.start().join()
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    with (
        KafkaCollector(kafka_bootstrap, topic) as collector,
        FaultProxy(str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))) as proxy,
    ):
        relay = Tapped(
            relay_process(via(database_url, proxy), f"kafka://{kafka_bootstrap}", "--metrics-port", str(port))
        )
        try:
            with HealthProbe(port) as probe:
                wait_until(lambda: probe.status() == 200, timeout=30)
                # Busy with the backlog: every claim comes back full, so the pipeline is full.
                wait_until(lambda: collector.count() >= 2_000, timeout=60)
                backlog = outbox_counts(database_url).get("pending", 0)
                started = time.monotonic()
                proxy.blackhole()
                time.sleep(OUTAGE_SECONDS / 2)
                proxy.reset()
                time.sleep(OUTAGE_SECONDS / 2)
                proxy.passthrough()
                ended = time.monotonic()
                # It resumes by itself and drains the backlog.
                wait_until(lambda: not unsent_keys(database_url), timeout=180)
                resumed = time.monotonic()
                expected = set(writers.ledger.committed)
                collector.wait_for(lambda ds: expected <= {d.idempotency_key for d in ds}, timeout=60)
            answers = probe.between(started, resumed)
        finally:
            code = relay.stop()
        result = collector.verdict(writers.ledger)
    not_ok = [(round(at - started, 1), status) for at, status in answers if status != 200]
    note = (
        f"{OUTAGE_SECONDS:g} s outage (black hole, then reset) with {backlog} events pending; "
        f"/healthz polled {len(answers)} times until the backlog drained {resumed - ended:.1f} s after; "
        f"not 200: {not_ok[:5]}"
    )
    print(f"liveness through a database outage: {result}; {note}")
    record("5d/database: /healthz through a database outage, pipeline full", result, note=note)
    assert backlog > 2 * 200, "the pipeline was not full when the outage began"
    assert len(answers) >= OUTAGE_SECONDS / PROBE_INTERVAL_SECONDS / 2, "the probe did not poll throughout"
    assert not_ok == [], f"/healthz was not 200 during the outage or the recovery: {not_ok[:10]}"
    assert code == 0, relay.text()[-3000:]
    assert (result.lost, result.leaked, result.unexpected, result.order_violations) == (0, 0, 0, 0), str(result)
