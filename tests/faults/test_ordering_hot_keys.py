"""Per-key order with hot keys: 3 relays, 5 keys, SIGKILLs, and a poison event in the middle of one key.

Five writers each own one key and commit to it without a break (some
transactions rolled back), so every key always has a backlog and consecutive
events to move together. Three relays are SIGKILLed and restarted on a
schedule whose every kill meets fresh commits. Halfway through, the writer of
one key commits a poison event, one the broker refuses for good, between two
events of the same transaction; it goes on writing that key afterwards.

What must hold:

- every committed event of the four other keys arrives, and for every key the
  first copies arrive exactly in write order (duplicates allowed);
- the hot key's events before the poison arrive; the poison is dead-lettered
  (``failed``); every event of its key after it is never delivered and is
  still ``pending`` in the table: the key is parked, and only that key;
- nothing rolled back is ever sent.

The quick version runs in ``make test``; ``make faults`` (RELAY_FAULTS_FULL=1)
runs more kills and more events. The RabbitMQ variant never restarts the
broker: only the relays are killed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest

import producers
from tests.faults.checker import Delivery, KafkaCollector, Verdict, Writers, verdict
from tests.faults.conftest import CRASH_ATTEMPTS, Recorder
from tests.faults.schedule import FaultSchedule
from tests.faults.test_bad_input import dead_letters
from tests.faults.test_process_faults import Tapped
from tests.faults.test_rabbitmq_faults import deliveries, drain_queue, durable_queue
from tests.integration.kafka_support import unique_topic
from tests.relay_support import relay_process, wait_until

FULL = os.environ.get("RELAY_FAULTS_FULL") == "1"
RELAYS = 3
KEYS = 5
#: The writers' quota; past it they go on until the last kill is over (and a margin).
EVENTS = 6_000 if FULL else 1_200
KILLS = 24 if FULL else 6
BATCH = 200
#: Each writer sleeps this long between 3-event transactions (30% rolled back): quick runs commit about
#: 40 events a second per key, more than today's relay moves on one key, so every key builds a backlog.
PAUSE_SECONDS = 0.05 if FULL else 0.03
#: How long the parked key is watched, relays running, once everything else arrived.
PARKED_WATCH_SECONDS = 3.0
#: Kafka: the producer refuses a message over ``message.max.bytes`` before sending it (MSG_SIZE_TOO_LARGE).
KAFKA_MAX_BYTES = 4096


@dataclass(frozen=True)
class Poison:
    """The poison event: its idempotency key, row id and key, and the seq of its key's event just before it."""

    idempotency_key: str
    id: int
    key: str
    after_seq: int


class PoisoningWriters(Writers):
    """One writer per key; once :attr:`poison_now` is set, the first writer commits one poison event.

    The poison goes into that writer's next committed transaction, right after
    the transaction's first event, so that events of its key are committed just
    before it and just after it in the same transaction.
    """

    def __init__(
        self, database_url: str, topic: str, *, payload: Any, headers: dict[str, str] | None = None, **kw: Any
    ) -> None:
        super().__init__(database_url, topic, count=KEYS, keys_per_writer=1, **kw)
        self.key_names = [f"w{w}-k0" for w in range(KEYS)]  # as Writers names them, one key per writer
        self.hot_key = self.key_names[0]
        self.poison_payload = payload
        self.poison_headers = headers
        self.poison_now = threading.Event()
        self.poison: Poison | None = None

    def _publish(self, conn: psycopg.Connection[Any], batch: list[tuple[str, str, int]], rollback: bool) -> None:
        if rollback or batch[0][1] != self.hot_key or self.poison is not None or not self.poison_now.is_set():
            super()._publish(conn, batch, rollback)
            return
        (first_idem, key, first_seq), *rest = batch
        with conn.transaction():
            producers.publish(conn, self.topic, {"key": key, "seq": first_seq}, key=key, idempotency_key=first_idem)
            idem = producers.publish(conn, self.topic, self.poison_payload, key=key, headers=self.poison_headers)
            row = conn.execute("SELECT id FROM outbox WHERE idempotency_key = %s", [idem]).fetchone()
            assert row is not None
            for later_idem, _key, seq in rest:
                producers.publish(conn, self.topic, {"key": key, "seq": seq}, key=key, idempotency_key=later_idem)
        self.poison = Poison(idem, int(row[0]), key, first_seq)


@dataclass
class Run:
    """What one scenario did: the writers and their poison, the relays' exit codes, the schedule."""

    writers: PoisoningWriters
    poison: Poison
    schedule: FaultSchedule
    kills: int
    codes: list[int]
    logs: list[str]
    write_seconds: float
    backlog: int  # events left to send (parked ones included) when the writers stopped
    drain_seconds: float

    @property
    def parked(self) -> set[str]:
        """The committed events of the poison's key written after it: never to be delivered."""
        return {
            idem
            for idem, (key, seq) in self.writers.ledger.committed.items()
            if key == self.poison.key and seq > self.poison.after_seq
        }


def rows(database_url: str) -> dict[str, tuple[int, str | None, str, int, str | None]]:
    """Every row left in the outbox: idempotency key -> (id, key, state, attempts, last_error)."""
    with psycopg.connect(database_url) as conn:
        found = conn.execute("SELECT idempotency_key, id, key, state, attempts, last_error FROM outbox").fetchall()
    return {idem: (id_, key, state, attempts, error) for idem, id_, key, state, attempts, error in found}


def unsent(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox WHERE state = 'pending'").fetchone()
    return int(row[0]) if row else 0


def settled(database_url: str, poison: Poison) -> bool:
    """Nothing left to send but the events of the poison's key written after it (the poison itself settled)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outbox WHERE state = 'pending' AND (key IS DISTINCT FROM %s OR id <= %s)",
            [poison.key, poison.id],
        ).fetchone()
    return row is not None and row[0] == 0


def kill_on_schedule(
    writers: PoisoningWriters, start: Callable[[], Tapped], relays: list[Tapped], seed: int, down: tuple[float, float]
) -> tuple[FaultSchedule, int]:
    """SIGKILL and restart a random relay ``KILLS`` times, each kill meeting fresh commits.

    Once half the kills are over the poison is written; the rest of the kills
    come after it was committed.
    """
    rng = random.Random(seed)
    kills = 0
    with FaultSchedule(writers) as schedule:
        while kills < KILLS:
            if kills == KILLS // 2:
                writers.poison_now.set()
                wait_until(lambda: writers.poison is not None or bool(writers.errors), timeout=30)
            time.sleep(rng.uniform(0.2, 1.0))
            victim = rng.randrange(RELAYS)
            # The fault lasts while the victim is down: the others take over its keys once its leases end.
            with schedule.fault(f"kill {kills + 1}"):
                relays[victim].stop(signal.SIGKILL)
                kills += 1
                time.sleep(rng.uniform(*down))
                relays[victim] = start()
    return schedule, kills


@contextlib.contextmanager
def relays_running(start: Callable[[], Tapped]) -> Iterator[tuple[list[Tapped], list[int], list[str]]]:
    """``RELAYS`` relays for the block; on leaving, each is stopped with SIGTERM and its code and log kept."""
    relays = [start() for _ in range(RELAYS)]
    codes: list[int] = []
    logs: list[str] = []
    try:
        yield relays, codes, logs
    finally:
        for relay in relays:
            codes.append(relay.stop())
            logs.append(relay.text())


def scenario(
    database_url: str,
    writers: PoisoningWriters,
    start: Callable[[], Tapped],
    received: Callable[[int], list[Delivery]],
    *,
    seed: int,
    down: tuple[float, float],
    drain_seconds: float,
) -> tuple[Run, list[Delivery]]:
    """Run the writers, the kills and the poison; wait until all but the parked key arrived.

    ``received(n)`` returns what the broker holds, once it holds ``n`` first
    copies (or its patience ran out). It is called with the relays still running.
    """
    with relays_running(start) as (relays, codes, logs):
        began = time.monotonic()
        schedule, kills = kill_on_schedule(writers, start, relays, seed, down)
        assert writers.poison is not None, "the poison was committed"
        poison = writers.poison
        written = time.monotonic()
        backlog = unsent(database_url)
        wait_until(lambda: settled(database_url, poison), timeout=drain_seconds, interval=0.5)
        run = Run(writers, poison, schedule, kills, codes, logs, written - began, backlog, time.monotonic() - written)
        expected = len(writers.ledger.committed) - len(run.parked)
        got = received(expected)
        # The parked key stays parked while the relays keep polling.
        time.sleep(PARKED_WATCH_SECONDS)
        got += received(0)
    return run, got


def first_copies(run: Run, got: Iterable[Delivery]) -> dict[str, list[int]]:
    """Per key, the seqs of the first copies of committed events, in arrival order (from the ledger, not the body)."""
    seen: set[str] = set()
    order: dict[str, list[int]] = {key: [] for key in run.writers.key_names}
    for d in got:
        if d.idempotency_key in seen or d.idempotency_key not in run.writers.ledger.committed:
            continue
        seen.add(d.idempotency_key)
        key, seq = run.writers.ledger.committed[d.idempotency_key]
        order.setdefault(key, []).append(seq)
    return order


def key_order_problems(run: Run, got: list[Delivery]) -> list[str]:
    """Each key whose first copies are not exactly its deliverable events in write order, and where it went wrong.

    The deliverable events are every committed event, except the parked key's
    events after the poison. Catches a reordering, a lost event, and a parked
    event that got out, key by key.
    """
    arrived = first_copies(run, got)
    problems = []
    for key in run.writers.key_names:
        wanted = sorted(
            seq
            for k, seq in run.writers.ledger.committed.values()
            if k == key and not (key == run.poison.key and seq > run.poison.after_seq)
        )
        actual = arrived.get(key, [])
        if actual == wanted:
            continue
        at = next(
            (i for i, (a, w) in enumerate(zip(actual, wanted, strict=False)) if a != w), min(len(actual), len(wanted))
        )
        problems.append(
            f"{key}: {len(actual)} first copies for {len(wanted)} deliverable events; from position {at}, "
            f"wanted seqs {wanted[at : at + 5]}, got {actual[at : at + 5]}"
        )
    return problems


def check(run: Run, got: list[Delivery], database_url: str, refusal: str) -> Verdict:
    """Every assertion of the scenario; returns the verdict for the record."""
    result = verdict(run.writers.ledger, got)
    parked = run.parked
    delivered = {d.idempotency_key for d in got}
    left = rows(database_url)

    # The scenario did what it says: load during every kill, a poison in the middle of a written key.
    assert run.kills == KILLS
    assert not run.schedule.unloaded(), run.schedule.note()
    assert result.rolled_back > 0, "some transactions were rolled back"
    assert run.poison.after_seq >= 1, "events of the poison's key were committed before it"
    assert parked, "events of the poison's key were committed after it"
    per_key = {
        key: sum(1 for k, _ in run.writers.ledger.committed.values() if k == key) for key in run.writers.key_names
    }
    assert min(per_key.values()) >= 50, per_key

    # Per-key order, nothing lost, nothing leaked: the first copies of each key are
    # exactly its deliverable events, in write order.
    problems = key_order_problems(run, got)
    assert not problems, "\n".join(problems)
    assert result.leaked == 0, f"rolled-back events were sent: {result}"
    assert result.unexpected == 0, f"events never written (or the poison) were delivered: {result}"
    assert result.order_violations == 0, str(result)
    assert result.lost == len(parked), str(result)

    # The poison is a dead letter; it blocks its key and nothing else.
    assert run.poison.idempotency_key not in delivered, "the poison was delivered"
    assert run.poison.idempotency_key in left, "the poison left the table: sent or skipped"
    poison_id, poison_key, state, attempts, error = left[run.poison.idempotency_key]
    assert (poison_id, poison_key, state) == (run.poison.id, run.poison.key, "failed"), left[run.poison.idempotency_key]
    assert attempts >= 1 and error is not None and refusal in error, (attempts, error)
    assert not parked & delivered, f"{len(parked & delivered)} events after the poison were delivered"
    assert set(left) == parked | {run.poison.idempotency_key}, "only the poison and its key's later events are left"
    for idem in parked:
        row_id, key, state, _attempts, _error = left[idem]
        assert (key, state) == (run.poison.key, "pending") and row_id > poison_id, left[idem]
    dead = dead_letters(database_url)
    assert set(dead) == {run.poison.idempotency_key}
    assert dead[run.poison.idempotency_key]["blocked_events"] == len(parked)

    assert result.duplicates <= BATCH * 2 * run.kills, str(result)
    assert run.codes == [0] * RELAYS, "\n".join(run.logs)
    return result


def for_the_record(run: Run, result: Verdict) -> Verdict:
    """The verdict as the results table shows it: the parked events are held on purpose, not lost."""
    return replace(result, lost=result.lost - len(run.parked))


def note(run: Run, result: Verdict, seconds: float) -> str:
    return (
        f"{KEYS} keys, {RELAYS} relays, {run.kills} SIGKILLs; poison after seq {run.poison.after_seq} of "
        f"{run.poison.key}, {len(run.parked)} events parked behind it; {result.duplicates} duplicates; "
        f"writers {run.write_seconds:.0f} s, then {run.backlog} unsent drained in {run.drain_seconds:.0f} s; "
        f"{seconds:.0f} s in all; {run.schedule.note()}"
    )


def judge_and_record(
    run: Run, got: list[Delivery], database_url: str, refusal: str, broker: str, began: float, record: Recorder
) -> None:
    """Check the run (the poison refused with ``refusal``) and put it in the results table."""
    result = check(run, got, database_url, refusal)
    text = note(run, result, time.monotonic() - began)
    print(f"hot keys, {broker}: {result}; {text}")
    scenario_name = f"1/ordering, hot keys: 5 keys, 3 relays, SIGKILLs, a poison mid-key ({broker})"
    record(scenario_name, for_the_record(run, result), runs=run.kills, note=text)


# --- Kafka ---------------------------------------------------------------------------


@pytest.mark.timeout(1200 if FULL else 420)
def test_hot_keys_keep_their_order_through_sigkills_and_a_poison_parks_only_its_key(
    database_url: str, kafka_bootstrap: str, record: Recorder
) -> None:
    began = time.monotonic()
    topic = unique_topic("hot")
    sink = f"kafka://{kafka_bootstrap}?message.max.bytes={KAFKA_MAX_BYTES}"

    def start() -> Tapped:
        args = ["--lease-seconds", "9", "--publish-timeout", "2", "--batch-size", str(BATCH)]
        return Tapped(relay_process(database_url, sink, *args, "--max-attempts", str(CRASH_ATTEMPTS)))

    writers = PoisoningWriters(
        database_url, topic, events=EVENTS, pause=PAUSE_SECONDS, payload={"poison": "x" * (KAFKA_MAX_BYTES * 2)}
    )
    with KafkaCollector(kafka_bootstrap, topic) as collector:
        taken = 0

        def received(n: int) -> list[Delivery]:
            nonlocal taken
            collector.wait_for(lambda ds: len({d.idempotency_key for d in ds}) >= n, timeout=60)
            time.sleep(1.0)
            fresh = collector.deliveries[taken:]  # one slice: atomic against the collector's appends
            taken += len(fresh)
            return fresh

        run, got = scenario(
            database_url, writers, start, received, seed=16, down=(0.5, 2.0), drain_seconds=600 if FULL else 180
        )
    judge_and_record(run, got, database_url, "MSG_SIZE_TOO_LARGE", "Kafka", began, record)


# --- RabbitMQ ------------------------------------------------------------------------


@pytest.mark.timeout(1200 if FULL else 420)
def test_hot_keys_keep_their_order_through_sigkills_and_a_poison_parks_only_its_key_on_rabbitmq(
    database_url: str, amqp_url: str, record: Recorder
) -> None:
    began = time.monotonic()

    def start() -> Tapped:
        return Tapped(relay_process(database_url, amqp_url, "--batch-size", str(BATCH)))

    with durable_queue(amqp_url) as queue:
        # A header RabbitMQ reserves: the sink refuses the event for good before publishing it.
        writers = PoisoningWriters(
            database_url, queue, events=EVENTS, pause=PAUSE_SECONDS, payload={"poison": True},
            headers={"x-death": "forged"},
        )  # fmt: skip

        def received(n: int) -> list[Delivery]:
            return deliveries(drain_queue(amqp_url, queue, n, timeout=60))

        run, got = scenario(
            database_url, writers, start, received, seed=17, down=(0.5, 2.0), drain_seconds=600 if FULL else 180
        )
    judge_and_record(run, got, database_url, "is reserved by RabbitMQ", "RabbitMQ", began, record)
