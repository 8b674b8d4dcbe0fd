"""What the table gauges cost on big tables: ``status()`` against ``gauges()``, by table size.

Each case is a throwaway database holding S1's seed rows (keyed, ~200 bytes
of JSON, the migrated table with its fillfactor), built with one INSERT ...
SELECT generate_series and VACUUM ANALYZE, autovacuum off so that nothing
changes under the measurement. The relay's own ``PostgresStore`` methods are
timed from Python (median of several calls on a warm cache, round trips
included), and their queries run once more under EXPLAIN (ANALYZE, BUFFERS).

On the 1,000,000-row table the gauges' estimate is then checked against the
exact counts after rows are delivered, added and marked sent with no ANALYZE
in between: the drift an operator would see until autovacuum analyses again.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from bench.services import DISTINCT_KEYS, SEED_SQL, TABLE, source_state
from relay.store import sql as named
from relay.store.base import Status
from relay.store.migrate import migrate
from relay.store.postgres import GAUGES_EXACT_UP_TO, PostgresStore

if TYPE_CHECKING:
    from bench.runner import Run

GAUGES_PATH = Path(__file__).parent / "results" / "gauges.json"
SIZES, LONG_SIZES = (100_000, 1_000_000), (100_000, 1_000_000, 3_000_000)
MIXED_SIZE = 1_000_000
CHURN_SIZE = 1_000_000
REPEATS = 7
#: The relay's own budget for one refresh of the counts (every 30 s per relay).
BUDGET_MS = 50.0
STATS_FLUSH_TIMEOUT_SECONDS = 15.0

# Every other event leased for a day (so still in flight while measured), one
# in a thousand dead-lettered: 50 parked keys per million.
MIXED_SQL = (
    "UPDATE outbox SET claim_token = gen_random_uuid(), lease_owner = 'bench', attempts = 1,"
    " lease_expires_at = now() + interval '1 day' WHERE id % 2 = 0",
    "UPDATE outbox SET state = 'failed', failed_at = now(), attempts = 10, last_error = 'bench: dead letter',"
    " claim_token = NULL, lease_owner = NULL, lease_expires_at = NULL WHERE id % 1000 = 1",
)
FRONT = "SELECT id FROM outbox WHERE state = 'pending' ORDER BY priority DESC, id LIMIT %s"
#: (what happened, [(statement, parameters), ...]), in order, each step in a session of its own.
CHURN: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = (
    (
        "relays delivered (deleted) the first 100,000 and writers added 50,000; no ANALYZE since",
        (
            (f"DELETE FROM outbox WHERE id IN ({FRONT})", [100_000]),
            (SEED_SQL, {"topic": "gauges", "keyed": True, "n": 50_000}),
        ),
    ),
    (
        "then the next 100,000 marked sent (--keep-sent); no ANALYZE since",
        ((f"UPDATE outbox SET state = 'sent', published_at = now() WHERE id IN ({FRONT})", [100_000]),),
    ),
    ("after ANALYZE", (("ANALYZE outbox", None),)),
)


def seed(url: str, rows: int, *, mixed: bool) -> dict[str, Any]:
    """Migrate, insert ``rows`` events (half leased and some failed if ``mixed``), VACUUM ANALYZE."""
    started = time.monotonic()
    migrate(url, TABLE)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outbox SET (autovacuum_enabled = off)")
        conn.execute(
            sql.SQL(SEED_SQL).format(keys=sql.Literal(DISTINCT_KEYS)), {"topic": "gauges", "keyed": True, "n": rows}
        )
        for statement in MIXED_SQL if mixed else ():
            conn.execute(statement)
        conn.execute("VACUUM (ANALYZE) outbox")
        sizes = conn.execute("SELECT pg_table_size('outbox'), pg_indexes_size('outbox')").fetchone()
    assert sizes is not None
    return {"seconds": time.monotonic() - started, "table_mb": sizes[0] / 2**20, "indexes_mb": sizes[1] / 2**20}


async def _timed(call: Callable[[], Awaitable[Any]], repeats: int) -> dict[str, Any]:
    """Median wall time of ``repeats`` calls after one warm-up call, and the last value."""
    value = await call()
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        value = await call()
        runs.append((time.perf_counter() - started) * 1000)
    shown = value.as_dict() if isinstance(value, Status) else value
    return {"median_ms": statistics.median(runs), "runs_ms": runs, "value": shown}


async def _calls(url: str, repeats: int) -> dict[str, Any]:
    store = PostgresStore(url, TABLE, owner="bench", lease_seconds=60, listen=False)
    await store.open()
    try:
        return {
            "status": await _timed(store.status, repeats),
            "gauges": await _timed(store.gauges, repeats),
            "oldest_pending_age": await _timed(store.oldest_pending_age, repeats),
        }
    finally:
        await store.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def plan_summary(explained: dict[str, Any], table: str = "outbox") -> dict[str, Any]:
    """The figures of one EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) that say what a query read."""
    plan = explained["Plan"]
    scans = []
    for node in _nodes(plan):
        if node.get("Relation Name") != table:
            continue
        text = node["Node Type"] + (f" using {node['Index Name']}" if node.get("Index Name") else "")
        rows = round(node["Actual Rows"] * node["Actual Loops"])
        text += f", {rows:,} row{'' if rows == 1 else 's'}"
        if "Heap Fetches" in node:
            text += f", {node['Heap Fetches']:,} heap fetch{'' if node['Heap Fetches'] == 1 else 'es'}"
        scans.append(text)
    workers = sum(node.get("Workers Launched", 0) for node in _nodes(plan))
    return {
        "execution_ms": explained["Execution Time"],
        "planning_ms": explained["Planning Time"],
        "shared_hit": plan.get("Shared Hit Blocks", 0),
        "shared_read": plan.get("Shared Read Blocks", 0),
        "workers": workers,
        "scans": scans,
    }


def explain(url: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the status, gauges and age queries, each run once before."""
    queries = {name: named.render(named.queries()[name], TABLE) for name in ("status", "gauges", "oldest_pending_age")}
    params = {"gauges": {"exact_up_to": GAUGES_EXACT_UP_TO, "table_name": '"outbox"', "state_column": "state"}}
    found = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, query in queries.items():
            conn.execute(query, params.get(name)).fetchall()
            row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ") + query, params.get(name)).fetchone()
            assert row is not None
            found[name] = plan_summary(row[0][0])
    return found


def _live_rows(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_stat_get_live_tuples('outbox'::regclass)").fetchone()
    return int(row[0]) if row else 0


def _wait_for_live_rows(url: str, expected: int) -> None:
    """Until the statistics system has the ended sessions' counts (or give up and measure anyway)."""
    deadline = time.monotonic() + STATS_FLUSH_TIMEOUT_SECONDS
    while _live_rows(url) != expected and time.monotonic() < deadline:
        time.sleep(0.2)


def churn(url: str, rows: int) -> list[dict[str, Any]]:
    """Change the table as relays and writers would, then compare the gauges with the exact counts."""
    steps = []
    live = rows
    for label, statements in CHURN:
        before = live
        # One session per step, ended before measuring: a session flushes its
        # row counts to the statistics system when it ends.
        with psycopg.connect(url, autocommit=True) as conn:
            for statement, params in statements:
                query = (
                    sql.SQL(statement).format(keys=sql.Literal(DISTINCT_KEYS)) if statement is SEED_SQL else statement
                )
                cur = conn.execute(query, params)
                if statement.startswith("DELETE"):
                    live -= cur.rowcount
                elif statement is SEED_SQL:
                    live += cur.rowcount
        if live != before:
            _wait_for_live_rows(url, live)
        calls = asyncio.run(_calls(url, 1))
        steps.append({"step": label, "status": calls["status"]["value"], "gauges": calls["gauges"]["value"]})
    return steps


def measure_case(run: Run, name: str, rows: int, *, mixed: bool = False, repeats: int = REPEATS) -> dict[str, Any]:
    """Build one table, time the three calls, explain their queries; churn the 1M table."""
    database = f"gauges_{'mixed_' if mixed else ''}{rows // 1000}k"
    url = run.cleanup.create_database(database)
    try:
        run.progress(f"gauges: seeding {rows:,} events{' (half leased, 0.1% failed)' if mixed else ''}")
        case: dict[str, Any] = {"name": name, "rows": rows, "mixed": mixed, "seed": seed(url, rows, mixed=mixed)}
        case["calls"] = asyncio.run(_calls(url, repeats))
        case["explain"] = explain(url)
        calls = case["calls"]
        run.progress(
            f"gauges {name}: status() {calls['status']['median_ms']:.1f} ms, "
            f"gauges() {calls['gauges']['median_ms']:.1f} ms, "
            f"oldest_pending_age() {calls['oldest_pending_age']['median_ms']:.2f} ms"
        )
        if rows == CHURN_SIZE and not mixed:
            case["index_build_seconds"] = _index_build_seconds(url)
            case["churn"] = churn(url, rows)
        return case
    finally:
        run.cleanup.drop_database(database)


def _index_build_seconds(url: str) -> float:
    """How long migration 0003's CREATE INDEX takes on this table (it blocks inserts meanwhile)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX outbox_failed_idx")
        started = time.monotonic()
        conn.execute(named.render("CREATE INDEX {failed_idx} ON {table} (key) WHERE state = 'failed'", TABLE))
        return time.monotonic() - started


def measure(run: Run, *, long: bool) -> None:
    """Every case; the result also goes to gauges.json, which docs/performance.md renders."""
    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "source": source_state(),
        "exact_up_to": GAUGES_EXACT_UP_TO,
        "repeats": REPEATS,
        "budget_ms": BUDGET_MS,
        "cases": [],
    }
    run.results["gauges"] = result
    for rows in LONG_SIZES if long else SIZES:
        result["cases"].append(measure_case(run, f"{rows:,} unsent", rows))
        run.save()
    result["cases"].append(measure_case(run, f"{MIXED_SIZE:,}: half in flight, 0.1% failed", MIXED_SIZE, mixed=True))
    GAUGES_PATH.parent.mkdir(parents=True, exist_ok=True)
    GAUGES_PATH.write_text(json.dumps(result, indent=2, default=str) + "\n")
