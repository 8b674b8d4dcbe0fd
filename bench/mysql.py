"""The relay on MySQL/MariaDB against the bare two-step loop (issue 17): ``make bench``'s
``mysql`` scenario, and ``python -m bench.mysql`` on its own.

- L_db_mysql: one PyMySQL connection at READ COMMITTED, ``SELECT id … ORDER BY id
  LIMIT 1000 FOR UPDATE SKIP LOCKED``, ``DELETE … WHERE id IN (…)``, ``COMMIT``,
  until the table is empty; taken before and after the drains, and their mean
  is the denominator, so that a machine that got busier moves both sides;
- the relay's Kafka drain (``outbox-relay run`` with its defaults, to a Tansu
  broker) of the same number of events, over 5,000, 1,000 and 8 keys, one key
  per event, and with null keys, from start to an empty table (issue 39); and
  each again with no broker (:mod:`bench.null_relay`: a sink that acknowledges
  at once), which leaves the relay's own work and its database's: the gap
  between the two is the broker's share of the machine's two cores, client
  and server, which the bare loops below never pay;
- L_steps_mysql: the issue's two-step claim with its lease, and the delete, and
  nothing else (:func:`bench.lease_loop.l_steps_mysql`), beside each L_db_mysql:
  the most any relay that claims as the issue prescribes gets here;
- L_keyed_mysql: L_steps_mysql with the least per-key check a claim that keeps
  nothing between claims must make (:func:`bench.lease_loop.l_keyed_steps_mysql`),
  over each keyed drain's backlog (5,000, 1,000 and 8 keys, one key per event),
  beside each L_steps_mysql: the keyed drains' floor, each beside its drain. A
  floor runs for FLOOR_SECONDS at most: over 8 keys it leases 8 events a claim
  (no runs), and its 50,000 would take minutes.

Each drain starts from a table filled the same way, in a database of its own
on the server (dropped at the end). The standalone command prints a table and
writes ``bench/results/mysql.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql

from bench.lease_loop import l_keyed_steps_mysql, l_steps_mysql
from bench.relayproc import NULL_SINK, RelayProcess
from bench.services import document_for
from devservers import Tansu
from relay.config import TableName
from relay.store.mysql import Target
from relay.store.mysql.migrate import migrate

SERVER_URL = os.environ.get("RELAY_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306")
RESULTS = Path(__file__).parent / "results" / "mysql.json"
#: The issue's drain: 50,000 events, over 5,000 keys and with null keys.
EVENTS = 50_000
KEYS = 5_000
#: The 0.8 x L_db_mysql the issue asks of the relay's drain.
TARGET_RATIO = 0.8
#: One key per event, in DRAINS.
PER_EVENT = -1
#: The drains: results key -> how many keys the events spread over (None: null keys; PER_EVENT: one each).
DRAINS: dict[str, int | None] = {
    "keyed": KEYS,
    "keys_1000": 1_000,
    "keys_8": 8,
    "key_per_event": PER_EVENT,
    "null_keys": None,
}
LABELS = {
    "keyed": f"{KEYS:,} keys",
    "keys_1000": "1,000 keys",
    "keys_8": "8 keys",
    "key_per_event": "one key per event",
    "null_keys": "null keys",
}
#: The drains L_keyed_mysql runs beside L_steps_mysql, on the same backlogs.
KEYED_FLOORS = ("keyed", "keys_1000", "keys_8", "key_per_event")
#: The longest an L_keyed_mysql run drains: its rate is then of the backlog's first part (8 keys: about 600 to
#: 900 of the 50,000 events; 1,000 keys most of them, 5,000 keys and one key per event all, on this machine).
FLOOR_SECONDS = 5.0
#: Issue 39's targets, as a share of L_steps_mysql in the same run.
STEPS_TARGETS = {"keyed": 0.8, "keys_1000": 0.8, "keys_8": None, "key_per_event": 0.9, "null_keys": 0.9}


def connect(url: str) -> Any:
    target = Target.parse(url)
    tls = target.tls.context()
    return pymysql.connect(
        host=target.host,
        port=target.port,
        user=target.user,
        password=target.password_bytes,
        database=target.database,
        charset="utf8mb4",
        autocommit=True,
        # Without TLS options PyMySQL 1.2 tries TLS anyway, and builds an SSL context with the system's CAs
        # for it at every connect: 20 ms of this process's CPU, on the machine the measured loops run on.
        ssl=tls,
        ssl_disabled=tls is None,
    )


def key_of(g: int, keys: int | None) -> str | None:
    """Event ``g``'s key when the events spread over ``keys`` keys (None: no key; PER_EVENT: one each)."""
    if keys is None:
        return None
    return f"k{g}" if keys == PER_EVENT else f"k{g % keys}"


def fill(url: str, events: int, *, keys: int | None, topic: str) -> None:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE TABLE outbox")
            for start in range(0, events, 5_000):
                rows = [
                    (topic, key_of(g, keys), json.dumps(document_for(g)))
                    for g in range(start, min(events, start + 5_000))
                ]
                cur.executemany("INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", rows)
    finally:
        conn.close()


def empty(conn: Any) -> bool:
    """Whether the outbox holds no row: one index entry read, where COUNT(*) reads them all (the drain asks
    twenty times a second, and a count of 25,000 rows took 2 to 5 ms of the server's CPU each time), on a
    connection the drain keeps (a connect each time took 20 ms of this process's CPU, beside the relay)."""
    with conn.cursor() as cur:
        cur.execute("SELECT 1 FROM outbox LIMIT 1")
        return cur.fetchone() is None


def l_db_mysql(url: str, events: int) -> float:
    """Rows per second of the bare two-step loop."""
    conn = connect(url)
    try:
        conn.autocommit(False)
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            started, done = time.perf_counter(), 0
            while True:
                cur.execute("SELECT id FROM outbox ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED")
                ids = tuple(row[0] for row in cur.fetchall())
                if not ids:
                    break
                cur.execute("DELETE FROM outbox WHERE id IN %s", (ids,))
                conn.commit()
                done += len(ids)
            return done / (time.perf_counter() - started)
    finally:
        conn.close()


def drain(url: str, sink_url: str, events: int) -> dict[str, float]:
    """Rows per second of one relay draining the table to ``sink_url``."""
    watcher = connect(url)
    try:
        with RelayProcess(url, sink_url) as relay:
            started = time.perf_counter()
            while not empty(watcher):
                relay.check_alive()
                time.sleep(0.05)
            seconds = time.perf_counter() - started
            claims_sum, claims = relay.claim_histogram()
    finally:
        watcher.close()
    return {
        "rows_per_second": events / seconds,
        "seconds": seconds,
        "mean_claim_ms": 1000 * claims_sum / claims if claims else 0.0,
    }


def measure(
    bootstrap: str,
    *,
    events: int = EVENTS,
    drains: tuple[str, ...] = tuple(DRAINS),
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """L_db_mysql and L_steps_mysql around the relay's Kafka drains, in a database made for the run."""
    database = f"relay_bench_{uuid.uuid4().hex[:8]}"
    admin = connect(SERVER_URL + "/mysql")
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}`")
    url = f"{SERVER_URL}/{database}"
    results: dict[str, Any] = {"events": events, "keys": KEYS, "target_ratio": TARGET_RATIO}
    try:
        migrate(url, TableName.parse("outbox"))
        with connect(url).cursor() as cur:
            cur.execute("SELECT VERSION()")
            results["server"] = cur.fetchone()[0]
        results["l_db_mysql_runs"] = []
        results["l_steps_mysql_runs"] = []
        keyed_floors = [label for label in KEYED_FLOORS if label in drains]
        results["l_keyed_mysql_runs"] = {label: [] for label in keyed_floors}

        def baseline() -> None:
            fill(url, events, keys=None, topic="bench")
            results["l_db_mysql_runs"].append(l_db_mysql(url, events))
            progress(f"L_db_mysql: {results['l_db_mysql_runs'][-1]:,.0f} rows/s")
            fill(url, events, keys=None, topic="bench")
            results["l_steps_mysql_runs"].append(l_steps_mysql(lambda: connect(url))["rate"])
            progress(f"L_steps_mysql: {results['l_steps_mysql_runs'][-1]:,.0f} rows/s")
            for label in keyed_floors:
                fill(url, events, keys=DRAINS[label], topic="bench")
                floor = l_keyed_steps_mysql(lambda: connect(url), seconds=FLOOR_SECONDS)
                results["l_keyed_mysql_runs"][label].append(floor["rate"])
                progress(f"L_keyed_mysql, {LABELS[label]}: {results['l_keyed_mysql_runs'][label][-1]:,.0f} rows/s")

        baseline()
        for label in drains:
            keys = DRAINS[label]
            fill(url, events, keys=keys, topic=f"bench-{label}-{uuid.uuid4().hex[:6]}")
            results[label] = drain(url, f"kafka://{bootstrap}", events)
            progress(f"relay Kafka drain on MySQL, {LABELS[label]}: {results[label]['rows_per_second']:,.0f} rows/s")
            fill(url, events, keys=keys, topic="bench")
            results[label]["no_broker"] = drain(url, NULL_SINK, events)
            progress(
                f"relay drain on MySQL, no broker, {LABELS[label]}: "
                f"{results[label]['no_broker']['rows_per_second']:,.0f} rows/s"
            )
        baseline()
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        admin.close()
    runs = results["l_db_mysql_runs"]
    results["l_db_mysql"] = sum(runs) / len(runs)
    steps = results["l_steps_mysql_runs"]
    results["l_steps_mysql"] = sum(steps) / len(steps)
    results["l_steps_ratio"] = results["l_steps_mysql"] / results["l_db_mysql"]
    results["l_keyed_mysql"] = {
        label: sum(rates) / len(rates) for label, rates in results["l_keyed_mysql_runs"].items()
    }
    for label in drains:
        results[label]["ratio"] = results[label]["rows_per_second"] / results["l_db_mysql"]
        results[label]["steps_ratio"] = results[label]["rows_per_second"] / results["l_steps_mysql"]
        if "no_broker" in results[label]:
            bare = results[label]["no_broker"]
            bare["steps_ratio"] = bare["rows_per_second"] / results["l_steps_mysql"]
        if label in results["l_keyed_mysql"]:
            results[label]["keyed_ratio"] = results[label]["rows_per_second"] / results["l_keyed_mysql"][label]
    return results


def scenario(run: Any, *, events: int = EVENTS) -> None:
    """``make bench``'s ``mysql`` scenario: :func:`measure` on the run's broker, into ``results["mysql"]``."""
    run.results["mysql"] = measure(run.bootstrap, events=events, progress=run.progress)


def _share(ratio: float) -> str:
    """A floor's share of L_steps_mysql: over 8 keys a few thousandths, which two places print as nothing."""
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:.3f}"


def mysql_text(results: dict[str, Any] | None) -> str:
    """The scenario's figures as a Markdown table, for docs/performance.md and the terminal."""
    if not results or "l_db_mysql" not in results:
        return "Not measured in this run (`python -m bench --only mysql`)."
    runs = ", ".join(f"{rate:,.0f}" for rate in results.get("l_db_mysql_runs", []))
    lines = [
        f"{results.get('server', 'MySQL')}, {results['events']:,} events of about 120 bytes; "
        f"L_db_mysql {results['l_db_mysql']:,.0f} rows/s (the mean of {runs}, before and after the drains).",
        "",
        "| relay Kafka drain on MySQL | rows/s | x L_db_mysql | x L_steps_mysql | issue 39's target | "
        "no broker x L_steps_mysql | L_keyed_mysql x L_steps_mysql | mean claim |",
        "| --- | --: | --: | --: | --- | --: | --: | --: |",
    ]
    floors = results.get("l_keyed_mysql") or {}
    for label in DRAINS:
        if label not in results:
            continue
        r = results[label]
        steps = r["rows_per_second"] / results["l_steps_mysql"] if results.get("l_steps_mysql") else None
        target = STEPS_TARGETS.get(label)
        verdict = "" if target is None or steps is None else f">= {target} ({'met' if steps >= target else 'missed'})"
        floor = floors[label] / results["l_steps_mysql"] if label in floors and results.get("l_steps_mysql") else None
        bare = r.get("no_broker", {}).get("steps_ratio")
        lines.append(
            f"| {LABELS[label]} | {r['rows_per_second']:,.0f} | {r['ratio']:.2f} | "
            f"{'' if steps is None else f'{steps:.2f}'} | {verdict} | {'' if bare is None else f'{bare:.2f}'} | "
            f"{'' if floor is None else _share(floor)} | "
            f"{r['mean_claim_ms']:.0f} ms |"
        )
    if "l_steps_mysql" in results:
        steps = ", ".join(f"{rate:,.0f}" for rate in results.get("l_steps_mysql_runs", []))
        lines += [
            "",
            f"L_steps_mysql {results['l_steps_mysql']:,.0f} rows/s (the mean of {steps}), "
            f"**{results['l_steps_ratio']:.2f} x L_db_mysql**: the issue's two-step claim with its lease "
            "(`SELECT ... FOR UPDATE SKIP LOCKED` with the rows' columns, the lease `UPDATE`, `COMMIT`) and the "
            "`DELETE` by token with its `COMMIT`, on two connections that overlap as the relay's do, on the same "
            "rows as L_db_mysql, and nothing else: no ordering, no broker, no events built "
            "(bench/lease_loop.py): what a relay that claims as the issue prescribes has to work with here, before "
            "anything of its own. *No broker*: the same relay draining the same backlog to a sink that "
            "acknowledges at once (bench/null_relay.py): the relay's own work and its database's, without the "
            "Kafka client's threads and the broker beside them on the machine's cores.",
        ]
    if floors:
        each = "; ".join(
            f"{LABELS[label]} {rate:,.0f} rows/s (the mean of "
            f"{', '.join(f'{r:,.0f}' for r in results['l_keyed_mysql_runs'][label])}), "
            f"{_share(rate / results['l_steps_mysql'])} x L_steps_mysql, the relay "
            + (f"{results[label]['keyed_ratio']:.2f} x it" if "keyed_ratio" in results.get(label, {}) else "not run")
            for label, rate in floors.items()
        )
        lines += [
            "",
            f"L_keyed_mysql: {each}. L_steps_mysql whose locking read also makes the least per-key check of a "
            "claim that keeps nothing between claims (a keyed row goes only if its key has no earlier unsent "
            "event: one probe of the key index, and one of the dead letters' while there are any), with no runs "
            f"and no state (bench/lease_loop.py), over each run's first {FLOOR_SECONDS:.0f} s at most: the keyed "
            "drains' floor.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--drains", nargs="+", choices=tuple(DRAINS), default=tuple(DRAINS))
    args = parser.parse_args(argv)
    with Tansu() as broker:
        results = measure(broker.bootstrap, events=args.events, drains=tuple(args.drains))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(mysql_text(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
