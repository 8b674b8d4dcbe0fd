"""Where S1 Kafka's time goes: phase timers, CPU samples and the server's own timings.

Three views of the same drain of the seeded table:

1. an in-process relay whose store and sink calls are wrapped in timers
   (wall time per phase: claim query, row decoding, building events,
   produce calls, waiting for acks, settle, metrics);
2. py-spy sampling the ``outbox-relay run`` process of a normal S1 drain
   (CPU per thread and function family), when py-spy is installed
   (``pip install py-spy`` into the venv, or ``BENCH_PY_SPY=/path/to/py-spy``);
3. EXPLAIN ANALYZE of the claim and settle statements on a fresh copy.

The wrappers reach into a few private methods; any that the relay no longer
has are skipped rather than failing the profile.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from bench import stats
from bench.attribution import categorize_collapsed, findings, subplan_times
from bench.consumers import KafkaReceiver
from bench.relayproc import RelayProcess
from bench.services import KAFKA_PARTITIONS, TABLE
from relay.app import RunConfig, build_relay
from relay.config import RelaySettings, parse_sink_url
from relay.store import sql as named

if TYPE_CHECKING:
    from bench.runner import Run

PROFILE_PATH = Path(__file__).parent / "results" / "profile.json"
PY_SPY_RATE = 200
DRAIN_TIMEOUT_SECONDS = 600.0
OUTBOX_CHECK_SECONDS = 0.2


class Timers:
    """Accumulated wall time and call counts per phase (thread-safe enough: one += per call)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def add(self, phase: str, elapsed: float) -> None:
        self.seconds[phase] += elapsed
        self.calls[phase] += 1

    def wrap_async(self, phase: str, function: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await function(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - started)

        return timed

    def wrap(self, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - started)

        return timed


def _instrument(relay: Any, timers: Timers) -> list[str]:
    """Wrap the relay's phases in timers; return the phases that could not be wrapped."""
    store, sink = relay.store, relay.sink
    missing = []
    # The loop starts a claim (the query, until its rows are in), then builds its events apart.
    store.start_claim = timers.wrap_async("claim: query until its rows are in", store.start_claim)
    store.settle = timers.wrap_async("settle (whole call)", store.settle)
    sink.publish = timers.wrap_async("publish (produce + wait for acks)", sink.publish)
    if hasattr(relay, "deliveries"):
        relay.deliveries.judge = timers.wrap("judge outcomes + metrics", relay.deliveries.judge)
    else:
        missing.append("judge")
    if hasattr(store, "_fetch"):
        store._fetch = _timed_fetch(store, timers)
    else:
        missing.append("claim query vs row decoding")
    if hasattr(sink, "_produce_all"):
        sink._produce_all = timers.wrap("produce calls (produce thread)", sink._produce_all)
    else:
        missing.append("produce calls")
    return missing


_ORIGINAL_FETCHALL = psycopg.AsyncCursor.fetchall
_IN_CLAIM: contextvars.ContextVar[bool] = contextvars.ContextVar("bench_in_claim", default=False)


def _timed_fetch(store: Any, timers: Timers) -> Callable[..., Awaitable[Any]]:
    """The store's ``_fetch``, with a claim's fetchall (psycopg's row decoding) timed on its own.

    psycopg's ``AsyncCursor.fetchall`` is wrapped for this process; it only
    records while a claim's ``_fetch`` runs in the same task.
    """
    original = store._fetch
    fetchall = psycopg.AsyncCursor.fetchall

    async def timed_fetchall(self: Any) -> Any:
        if not _IN_CLAIM.get():
            return await fetchall(self)
        started = time.perf_counter()
        try:
            return await fetchall(self)
        finally:
            timers.add("claim: fetchall (psycopg row decoding)", time.perf_counter() - started)

    psycopg.AsyncCursor.fetchall = timed_fetchall  # type: ignore[method-assign]

    async def fetch(name: str, *args: Any, **kwargs: Any) -> Any:
        if name not in ("claim", "claim_hinted"):
            return await original(name, *args, **kwargs)
        token = _IN_CLAIM.set(True)
        started = time.perf_counter()
        try:
            return await original(name, *args, **kwargs)
        finally:
            timers.add("claim: _fetch (query, wire, decoding)", time.perf_counter() - started)
            _IN_CLAIM.reset(token)

    return fetch


async def _drain_in_process(url: str, bootstrap: str, events: int) -> dict[str, Any]:
    """Drain with the timed relay in this process; done when the outbox is empty.

    No consumer runs in this process: its thread would take turns with the
    relay for the interpreter lock and inflate every phase.
    """
    settings = RelaySettings()
    relay = build_relay(
        RunConfig(database_url=url, table=TABLE, sink=parse_sink_url(f"kafka://{bootstrap}"), settings=settings)
    )
    timers = Timers()
    missing = _instrument(relay, timers)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    started = time.perf_counter()
    deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher:
        while time.monotonic() < deadline and not task.done():
            row = await (await watcher.execute("SELECT count(*) FROM outbox")).fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(OUTBOX_CHECK_SECONDS)
    elapsed = time.perf_counter() - started
    stop.set()
    try:
        await task
    finally:
        psycopg.AsyncCursor.fetchall = _ORIGINAL_FETCHALL  # type: ignore[method-assign]
    # Split the claim: decoding (fetchall), the rest of _fetch (query, wire), the rest of claim (Events).
    claims = timers.calls["claim (whole call)"] or 1
    whole = timers.seconds.get("claim (whole call)", 0.0)
    fetched = timers.seconds.pop("claim: _fetch (query, wire, decoding)", None)
    if fetched is not None:
        decoding = timers.seconds.get("claim: fetchall (psycopg row decoding)", 0.0)
        timers.seconds["claim: query (server + wire)"] = fetched - decoding
        timers.seconds["claim: sorting + building Events"] = whole - fetched
        timers.calls["claim: query (server + wire)"] = timers.calls["claim: sorting + building Events"] = claims
    batches = timers.calls["publish (produce + wait for acks)"] or 1
    return {
        "seconds": elapsed,
        "rate": events / elapsed,
        "batches": batches,
        "pipeline_depth": settings.pipeline_depth,
        "batch_size": settings.batch_size,
        "not_measured": missing,
        "by_phase": {
            phase: {
                "seconds": seconds,
                "per_batch_ms": seconds / (timers.calls[phase] or 1) * 1000,
                "share": seconds / elapsed,
            }
            for phase, seconds in sorted(timers.seconds.items())
        },
    }


def _py_spy() -> str | None:
    candidates = [os.environ.get("BENCH_PY_SPY"), str(Path(sys.executable).parent / "py-spy"), shutil.which("py-spy")]
    return next((c for c in candidates if c and Path(c).exists()), None)


def _sample_subprocess(run: Run, url: str, topic: str, tool: str) -> dict[str, Any]:
    """A normal S1 relay process, sampled by py-spy between 10% and 90% received."""
    events = run.events
    receiver = KafkaReceiver(run.bootstrap, topic, KAFKA_PARTITIONS)
    receiver.start()
    receiver.ready.wait(30)
    out = Path(tempfile.mkdtemp(prefix="bench-pyspy-")) / "stacks.txt"
    try:
        with RelayProcess(url, f"kafka://{run.bootstrap}") as relay:
            while receiver.count < events * 0.1:
                relay.check_alive()
                time.sleep(0.02)
            spy = subprocess.Popen(
                [tool, "record", "--pid", str(relay.pid), "--rate", str(PY_SPY_RATE), "--format", "raw",
                 "--threads", "--nonblocking", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            sampled_from = time.monotonic()
            while receiver.count < events * 0.9:
                relay.check_alive()
                time.sleep(0.02)
            sampled_seconds = time.monotonic() - sampled_from
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
            relay.discard_log()
    finally:
        receiver.stop()
    text = out.read_text() if out.exists() else ""
    shutil.rmtree(out.parent, ignore_errors=True)
    by_category, by_thread, samples = categorize_collapsed(text)
    possible = PY_SPY_RATE * sampled_seconds
    return {
        "tool": "py-spy",
        "rate": stats.window_rate(receiver.marks, events, 0.1, 0.9),
        "samples": samples,
        "seconds": sampled_seconds,
        "by_category": by_category,
        "by_thread": by_thread,
        # A thread sampled in every tick was on a CPU (or runnable) all the time.
        "busy_by_thread": {name: share * samples / possible for name, share in by_thread.items()},
    }


def _explain(url: str) -> dict[str, Any]:
    """EXPLAIN ANALYZE of one claim of 1,000, its settle, and L_db's statement, all rolled back."""
    queries = {name: named.render(text, TABLE) for name, text in named.queries().items()}
    token = uuid.uuid4()
    found: dict[str, Any] = {}
    with psycopg.connect(url) as conn:

        def explain(label: str, query: Any, params: dict[str, Any] | None = None) -> None:
            statement = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + query
            plan = conn.execute(statement, params).fetchone()[0][0]  # type: ignore[index]
            found[label] = {
                "execution_ms": plan["Execution Time"],
                "planning_ms": plan["Planning Time"],
                "parts_ms": subplan_times(plan["Plan"]),
            }

        claim = {"after": 0, "limit": 1000, "max_bytes": 16 * 2**20, "max_attempts": 10, "token": token,
                 "owner": "bench", "lease_seconds": 60.0,
                 # No batches in flight to go on from: the claim's chain parameters, empty.
                 "mine": [], "tail_keys": [], "tail_ids": [], "tail_topics": []}  # fmt: skip
        explain("claim UPDATE (1,000 rows)", queries["claim"], claim)
        ids = [row[0] for row in conn.execute("SELECT id FROM outbox WHERE claim_token = %s", [token])]
        explain("settle DELETE (ack_delete, 1,000 ids)", queries["ack_delete"], {"ids": ids, "token": token})
        conn.rollback()
        from bench.baselines import DRAIN_SQL

        explain("L_db DELETE ... RETURNING (1,000 rows)", psycopg.sql.SQL(DRAIN_SQL))
        conn.rollback()
    return found


def profile(run: Run) -> None:
    """Profile S1 Kafka three ways and record the findings in the run's results and profile.json."""
    template = run.template("seed")
    bootstrap = run.bootstrap
    result: dict[str, Any] = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "events": run.events}
    url = run.cleanup.create_database("prof_explain", template=template)
    try:
        result["explain"] = _explain(url)
    finally:
        run.cleanup.drop_database("prof_explain")
    run.progress(f"profile: EXPLAIN ANALYZE {json.dumps(result['explain'])}")
    tool = _py_spy()
    if tool:
        topic = run.cleanup.create_topic("s1")
        url = run.cleanup.create_database("prof_spy", template=template)
        try:
            run.progress("profile: py-spy on an outbox-relay run process")
            result["cpu"] = _sample_subprocess(run, url, topic, tool)
        finally:
            run.cleanup.drop_database("prof_spy")
            run.cleanup.delete_topic(topic)
    else:
        run.progress("profile: py-spy not found (pip install py-spy, or set BENCH_PY_SPY); CPU samples skipped")
    topic = run.cleanup.create_topic("s1")
    url = run.cleanup.create_database("prof_timers", template=template)
    try:
        run.progress("profile: in-process relay with phase timers")
        result["phases"] = asyncio.run(_drain_in_process(url, bootstrap, run.events))
    finally:
        run.cleanup.drop_database("prof_timers")
        run.cleanup.delete_topic(topic)
    result["notes"] = findings(result)
    run.results["profile"] = result
    PROFILE_PATH.parent.mkdir(parents=True, exist_ok=True)
    PROFILE_PATH.write_text(json.dumps(result, indent=2, default=str) + "\n")
