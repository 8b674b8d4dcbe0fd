"""``python -m bench.mysql``: the relay on MySQL/MariaDB against the bare two-step loop (issue 17).

- L_db_mysql: one PyMySQL connection at READ COMMITTED, ``SELECT id … ORDER BY id
  LIMIT 1000 FOR UPDATE SKIP LOCKED``, ``DELETE … WHERE id IN (…)``, ``COMMIT``,
  until the table is empty;
- the relay's Kafka drain (``outbox-relay run`` with its defaults, to a Tansu
  broker) of the same number of events, over 5,000 keys and with null keys,
  from start to an empty table.

Each drain starts from a table filled the same way; the ratio is rows/s over
L_db_mysql's rows/s measured in the same run. Prints a table and writes
``bench/results/mysql.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pymysql

from bench.relayproc import RelayProcess
from bench.services import document_for
from devservers import Tansu
from relay.config import TableName
from relay.store.mysql import Target
from relay.store.mysql.migrate import migrate

SERVER_URL = os.environ.get("RELAY_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306")
RESULTS = Path(__file__).parent / "results" / "mysql.json"
KEYS = 5_000
#: The 0.8 x L_db_mysql the issue asks of the relay's drain.
TARGET_RATIO = 0.8


def connect(url: str) -> Any:
    target = Target.parse(url)
    return pymysql.connect(
        host=target.host,
        port=target.port,
        user=target.user,
        password=target.password,
        database=target.database,
        charset="utf8mb4",
        autocommit=True,
    )


def fill(url: str, events: int, *, keyed: bool, topic: str) -> None:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE TABLE outbox")
            for start in range(0, events, 5_000):
                rows = [
                    (topic, f"k{g % KEYS}" if keyed else None, json.dumps(document_for(g)))
                    for g in range(start, min(events, start + 5_000))
                ]
                cur.executemany("INSERT INTO outbox (topic, `key`, payload) VALUES (%s, %s, %s)", rows)
    finally:
        conn.close()


def count(url: str) -> int:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM outbox")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


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


def drain(url: str, bootstrap: str, events: int) -> dict[str, float]:
    """Rows per second of one relay draining the table to Kafka."""
    with RelayProcess(url, f"kafka://{bootstrap}") as relay:
        started = time.perf_counter()
        while count(url):
            relay.check_alive()
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        claims_sum, claims = relay.claim_histogram()
    return {
        "rows_per_second": events / seconds,
        "seconds": seconds,
        "mean_claim_ms": 1000 * claims_sum / claims if claims else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50_000)
    args = parser.parse_args(argv)
    database = f"relay_bench_{uuid.uuid4().hex[:8]}"
    admin = connect(SERVER_URL + "/mysql")
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}`")
    url = f"{SERVER_URL}/{database}"
    results: dict[str, Any] = {"events": args.events, "keys": KEYS}
    try:
        migrate(url, TableName.parse("outbox"))
        with connect(url).cursor() as cur:
            cur.execute("SELECT VERSION()")
            results["server"] = cur.fetchone()[0]
        fill(url, args.events, keyed=False, topic="bench")
        results["l_db_mysql"] = l_db_mysql(url, args.events)
        with Tansu() as broker:
            for label, keyed in (("keyed", True), ("null_keys", False)):
                fill(url, args.events, keyed=keyed, topic=f"bench-{label}-{uuid.uuid4().hex[:6]}")
                results[label] = drain(url, broker.bootstrap, args.events)
                results[label]["ratio"] = results[label]["rows_per_second"] / results["l_db_mysql"]
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        admin.close()
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{results['server']}, {args.events:,} events")
    print(f"L_db_mysql: {results['l_db_mysql']:,.0f} rows/s")
    for label in ("keyed", "null_keys"):
        r = results[label]
        verdict = "meets" if r["ratio"] >= TARGET_RATIO else "misses"
        print(
            f"relay Kafka drain, {label}: {r['rows_per_second']:,.0f} rows/s = {r['ratio']:.2f} x L_db_mysql "
            f"({verdict} {TARGET_RATIO}); mean claim {r['mean_claim_ms']:.0f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
