"""``python -m bench.claim_shapes``: the relay's claim against a claim of key heads and runs (issue 16).

Issue 16 names "lease a run of a key's consecutive events together" as a way
to make per-key order cheap: find the heads of a few keys, then take a long
run of each, so that a claim pays per key for fewer keys. This measures it
before anything is built on it, in the serial loop of
``../shared/notes/per-key-claim.md``: one connection claims at most 2,000
events, deletes them by claim token, and claims again, with no broker, on a
backlog written with COPY whose keys take turns (as in the ``keys`` scenario),
beside L_db's bare ``DELETE ... RETURNING`` loop on the same backlog.

- ``relay``: the relay's own claim, as it ships (``claim`` in relay/store/queries.sql).
- ``runs``: the heads of the first ``heads`` keys in (priority, id) order
  (each the oldest unsent event of its key, due and unleased), then up to
  ``run`` more pending events of each key, taken along the key's index with
  ``FOR UPDATE SKIP LOCKED``. It leaves out what a real claim needs to keep
  order (stopping a run at a row another claim holds, at another topic, at a
  row not yet due): a lower bound on the cost of the shape.
- ``runs, checked``: ``runs`` plus that check, as the relay's claim makes it
  (a second walk of each key, cut at the first row the claim did not lock).

The figures are for a reader deciding on the design; nothing in the relay
uses this module.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from bench.keys import SPREADS, Spread, document
from bench.services import PG_URL, TABLE, require_postgres, url_for
from relay.store.migrate import migrate
from relay.store.sql import queries, render

#: The relay's default batch size; L_db's is fixed at 1,000 (bench/baselines.py).
LIMIT = 2000
MAX_ATTEMPTS = 10

_HEADS: LiteralString = """
WITH heads AS MATERIALIZED (
    SELECT o.id, o.key, o.topic
    FROM {table} AS o
    JOIN LATERAL (
        SELECT f.id FROM {table} AS f
        WHERE f.key = o.key AND f.state IN ('pending', 'failed')
        ORDER BY f.id
        LIMIT 1) AS first ON first.id = o.id
    WHERE o.state = 'pending' AND o.key IS NOT NULL AND o.deliver_at <= now()
      AND (o.lease_expires_at IS NULL OR (o.lease_expires_at < now() AND o.attempts < %(max_attempts)s))
    ORDER BY o.priority DESC, o.id
    LIMIT %(heads)s
    FOR UPDATE OF o SKIP LOCKED
), locked AS MATERIALIZED (
    SELECT w.id
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT e.id FROM {table} AS e
        WHERE e.key = h.key AND e.id > h.id AND e.state = 'pending'
        ORDER BY e.id
        LIMIT %(run)s
        FOR UPDATE SKIP LOCKED) AS w
)"""
_CHECKED: LiteralString = """, unbroken AS (
    SELECT w.id
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT e.id,
               bool_and((e.topic = h.topic AND e.deliver_at <= now() AND e.lease_expires_at IS NULL
                         AND e.id IN (SELECT l.id FROM locked AS l)) IS TRUE)
                   OVER (ORDER BY e.id ROWS UNBOUNDED PRECEDING) AS unbroken
        FROM {table} AS e
        WHERE e.key = h.key AND e.id > h.id AND e.state IN ('pending', 'failed')
        ORDER BY e.id
        LIMIT %(run)s) AS w
    WHERE w.unbroken
)"""
_LEASE: LiteralString = """
UPDATE {table} AS o
SET claim_token = %(token)s, lease_owner = %(owner)s,
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s), attempts = o.attempts + 1
FROM (SELECT id FROM heads UNION ALL SELECT id FROM %(from)s) AS c
WHERE o.id = c.id
RETURNING o.id, o.topic, o.key, o.payload::text AS payload, o.headers::text AS headers, o.idempotency_key"""
RUNS: LiteralString = _HEADS + _LEASE.replace("%(from)s", "locked")
RUNS_CHECKED: LiteralString = _HEADS + _CHECKED + _LEASE.replace("%(from)s", "unbroken")


@dataclass(frozen=True)
class Shape:
    """A claim to measure: its query and its parameters besides the token."""

    name: str
    query: LiteralString
    params: dict[str, Any]


def shapes(spread: Spread) -> list[Shape]:
    """The relay's claim, and the runs claim with heads x run = LIMIT for ``spread``'s keys."""
    heads = min(spread.keys or LIMIT, 20)
    run = LIMIT // heads - 1
    common = {"max_attempts": MAX_ATTEMPTS, "owner": "bench", "lease_seconds": 60.0}
    relay = {"after": 0, "limit": LIMIT, "max_bytes": 2**62, "tail_keys": [], "tail_ids": [], "tail_topics": []}
    found = [Shape("relay", queries()["claim"], {**common, **relay, "mine": []})]
    if not spread.keys:  # no key or one event a key: no run to take
        return found
    for name, query in (("runs", RUNS), ("runs, checked", RUNS_CHECKED)):
        found.append(Shape(f"{name} ({heads} x {run + 1})", query, {**common, "heads": heads, "run": run}))
    return found


def seed(conn: psycopg.Connection[Any], spread: Spread, events: int) -> None:
    """Empty the outbox and COPY ``events`` events with ``spread``'s keys into it."""
    conn.execute("TRUNCATE outbox")
    with conn.cursor().copy("COPY outbox (topic, key, payload) FROM STDIN") as copy:
        for g in range(1, events + 1):
            copy.write_row(("claim-shapes", spread.key(g), json.dumps(document(g))))
    conn.execute("VACUUM (ANALYZE) outbox")


def claim_loop(conn: psycopg.Connection[Any], shape: Shape) -> tuple[int, float, float]:
    """Claim, delete by token, until the outbox is empty: (events, events/s, mean claim in ms)."""
    query = render(shape.query, TABLE)
    drained = claims = 0
    claiming = 0.0
    started = time.perf_counter()
    while True:
        token = uuid.uuid4()
        before = time.perf_counter()
        rows = conn.execute(query, {**shape.params, "token": token}).fetchall()
        claiming += time.perf_counter() - before
        if not rows:
            break
        conn.execute(sql.SQL("DELETE FROM {} WHERE claim_token = %s").format(sql.Identifier("outbox")), (token,))
        drained += len(rows)
        claims += 1
    elapsed = time.perf_counter() - started
    return drained, drained / elapsed, 1000 * claiming / max(claims, 1)


def l_db(conn: psycopg.Connection[Any]) -> float:
    """L_db's loop (bench/baselines.py) on the backlog in the outbox: events per second."""
    from bench.baselines import DRAIN_SQL

    drained = 0
    started = time.perf_counter()
    while rows := conn.execute(DRAIN_SQL).fetchall():
        drained += len(rows)
    return drained / (time.perf_counter() - started)


def measure(url: str, spreads: Sequence[Spread], events: int, rounds: int) -> list[str]:
    """The table's rows: each round takes L_db, then every shape on every spread."""
    lines = ["| round | keys | claim | events/s | x L_db | mean claim |", "| --: | --- | --- | --: | --: | --: |"]
    with psycopg.connect(url, autocommit=True) as conn:
        for number in range(1, rounds + 1):
            seed(conn, SPREADS["k1000"], events)
            base = l_db(conn)
            lines.append(f"| {number} | 1,000 keys | L_db | {base:,.0f} | 1 | |")
            print(lines[-1], flush=True)
            for spread in spreads:
                for shape in shapes(spread):
                    seed(conn, spread, events)
                    drained, rate, claim_ms = claim_loop(conn, shape)
                    if drained != events:
                        raise RuntimeError(f"{shape.name} on {spread.label} drained {drained} of {events}")
                    lines.append(
                        f"| {number} | {spread.label} | {shape.name} | {rate:,.0f} | {rate / base:.3f} "
                        f"| {claim_ms:.1f} ms |"
                    )
                    print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_shapes", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="events per drain (default 100,000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, each with its own L_db (default 2)")
    parser.add_argument("--spreads", default="k1000,k8,k1", help="of " + ", ".join(SPREADS) + " (default k1000,k8,k1)")
    args = parser.parse_args(argv)
    spreads = [SPREADS[name] for name in args.spreads.split(",")]
    require_postgres()
    database = f"bench_claim_shapes_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        url = url_for(database)
        migrate(url, TABLE)
        measure(url, spreads, args.events, args.rounds)
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))


if __name__ == "__main__":
    main()
