"""What the claim reads on real PostgreSQL when another relay has keys in flight.

A key whose oldest unsent event another relay holds takes a place among the
candidates (so the scan stays bounded), but its run cannot start. Walking its
index anyway cost the claim far more than the walk: the run's topic is then
unknown (NULL), and PostgreSQL compares a row holding a NULL against every
entry of the candidates' hash table, one by one. A second relay's claims on a
1,000-key backlog took 350 ms instead of 20. These tests count the walks in
the claim's plan, so they fail when the claim walks a key it cannot take.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg import sql

from relay.config import TableName
from relay.store import sql as named

NO_CHAIN: dict[str, list[Any]] = {"mine": [], "tail_keys": [], "tail_ids": [], "tail_topics": []}


def claim_params(limit: int, token: UUID, **chain: list[Any]) -> dict[str, Any]:
    return {"after": -(2**63), "priorities": [0], "limit": limit, "max_bytes": 2**62, "max_attempts": 5,
            "token": token, "owner": "t", "lease_seconds": 30, **{**NO_CHAIN, **chain}}  # fmt: skip


def query(name: str) -> sql.Composed:
    return named.render(named.queries()[name], TableName.parse("outbox"))


def seed(conn: psycopg.Connection[Any], keys: list[str], per_key: int) -> None:
    """``per_key`` events of each key, the keys taking turns (so every key's events lie apart)."""
    with conn.cursor().copy("COPY outbox (topic, key, payload) FROM STDIN") as copy:
        for _ in range(per_key):
            for key in keys:
                copy.write_row(("t", key, "{}"))


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def walks(plan: dict[str, Any]) -> int:
    """How many times the claim walked a key's index for its run (the members CTE's key-index scans)."""
    [members] = [node for node in plan["Plans"] if node.get("Subplan Name") == "CTE members"]
    return sum(
        int(node["Actual Loops"]) for node in nodes(members) if str(node.get("Index Name", "")).endswith("key_idx")
    )


def explained_claim(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any]
) -> tuple[dict[str, Any], set[int]]:
    """The claim's plan (EXPLAIN ANALYZE) and the ids it leased, rolled back."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + query(name), params).fetchone()
        assert row is not None
        leased = {r[0] for r in conn.execute("SELECT id FROM outbox WHERE claim_token = %s", [params["token"]])}
    return row[0][0]["Plan"], leased


def first_events(conn: psycopg.Connection[Any], keys: list[str]) -> list[int]:
    return [
        int(r[0])
        for r in conn.execute("SELECT min(id) FROM outbox WHERE key = ANY(%s) GROUP BY key ORDER BY 1", [keys])
    ]


def lease_by_another_relay(conn: psycopg.Connection[Any], ids: list[int]) -> None:
    conn.execute(
        "UPDATE outbox SET claim_token = %s, lease_owner = 'other', attempts = 1,"
        " lease_expires_at = now() + interval '1 minute' WHERE id = ANY(%s)",
        [uuid4(), ids],
    )


def lease_heads_here(conn: psycopg.Connection[Any], keys: list[str]) -> dict[str, list[Any]]:
    """Lease the first event of each of ``keys`` to this relay; the claim parameters that go on from them."""
    token = uuid4()
    heads = first_events(conn, keys)
    conn.execute(
        "UPDATE outbox SET claim_token = %s, lease_owner = 't', attempts = 1,"
        " lease_expires_at = now() + interval '1 minute' WHERE id = ANY(%s)",
        [token, heads],
    )
    tails = dict(conn.execute("SELECT key, id FROM outbox WHERE id = ANY(%s)", [heads]).fetchall())
    return {
        "mine": [token],
        "tail_keys": list(tails),
        "tail_ids": list(tails.values()),
        "tail_topics": ["t"] * len(tails),
    }


def test_no_walk_for_keys_whose_first_event_another_relay_holds(database_url: str) -> None:
    held = [f"held-{i}" for i in range(40)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        seed(conn, held, 4)
        lease_by_another_relay(conn, first_events(conn, held))
        for name in ("claim", "claim_hinted"):
            plan, leased = explained_claim(conn, name, claim_params(200, uuid4()))
            assert leased == set()
            assert walks(plan) == 0, name


def test_free_keys_beside_held_ones_are_walked_and_claimed_whole(database_url: str) -> None:
    held = [f"held-{i}" for i in range(30)]
    free = [f"free-{i}" for i in range(10)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        seed(conn, held + free, 3)
        lease_by_another_relay(conn, first_events(conn, held))
        expected = {int(r[0]) for r in conn.execute("SELECT id FROM outbox WHERE key = ANY(%s)", [free])}
        for name in ("claim", "claim_hinted"):
            plan, leased = explained_claim(conn, name, claim_params(500, uuid4()))
            assert leased == expected
            assert walks(plan) == len(free), name


def test_a_chained_claim_walks_only_its_own_keys_in_flight(database_url: str) -> None:
    """This relay's keys in flight go on after their tails; another relay's take no walk."""
    mine = [f"mine-{i}" for i in range(5)]
    other = [f"other-{i}" for i in range(20)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        seed(conn, mine + other, 3)
        lease_by_another_relay(conn, first_events(conn, other))
        chain = lease_heads_here(conn, mine)
        expected = {
            int(r[0]) for r in conn.execute("SELECT id FROM outbox WHERE key = ANY(%s) AND claim_token IS NULL", [mine])
        }
        plan, leased = explained_claim(conn, "claim", claim_params(500, uuid4(), **chain))
        assert leased == expected
        assert walks(plan) == len(mine)


def tail_reads(plan: dict[str, Any]) -> list[tuple[str, int]]:
    """How the claim read the tails' rows (to check their leases): each node and its loops."""
    return [(node["Node Type"], int(node["Actual Loops"])) for node in nodes(plan) if node.get("Alias") == "tail"]


def test_a_claim_with_many_tails_probes_each_instead_of_reading_the_table(database_url: str) -> None:
    """Each tail's lease is one primary-key probe, however many tails there are. With hundreds of them,
    PostgreSQL chose to check them by hashing over a scan of the whole table: O(backlog) every claim."""
    keys = [f"key-{i}" for i in range(300)]
    with psycopg.connect(database_url, autocommit=True) as conn:
        seed(conn, keys, 3)
        conn.execute("ANALYZE outbox")
        chain = lease_heads_here(conn, keys)
        expected = {int(r[0]) for r in conn.execute("SELECT id FROM outbox WHERE claim_token IS NULL")}
        for name in ("claim", "claim_hinted"):
            plan, leased = explained_claim(conn, name, claim_params(2000, uuid4(), **chain))
            assert leased == expected
            assert tail_reads(plan) == [("Index Scan", len(keys))], name


def test_many_tails_of_which_some_no_longer_hold(database_url: str) -> None:
    """The same probe per tail decides as before: a key whose tail still holds goes on after it; a key
    named as in flight whose tail's lease ran out, or was taken by another relay, or whose tail was
    settled meanwhile, sits this claim out (the next one, not naming it, starts it from its first)."""
    groups = {name: [f"{name}-{i}" for i in range(80)] for name in ("holds", "expired", "taken", "settled")}
    every = [key for keys in groups.values() for key in keys]
    with psycopg.connect(database_url, autocommit=True) as conn:
        seed(conn, every, 3)
        conn.execute("ANALYZE outbox")
        chain = lease_heads_here(conn, every)
        tails = dict(zip(chain["tail_keys"], chain["tail_ids"], strict=True))

        def ids_of(keys: list[str]) -> list[int]:
            return [tails[key] for key in keys]

        conn.execute("UPDATE outbox SET lease_expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
                     [ids_of(groups["expired"])])  # fmt: skip
        lease_by_another_relay(conn, ids_of(groups["taken"]))
        conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", [ids_of(groups["settled"])])

        holding = {int(r[0]) for r in conn.execute("SELECT id FROM outbox WHERE key = ANY(%s)", [groups["holds"]])}
        expected = holding - set(ids_of(groups["holds"]))  # the two after each tail that holds
        for name in ("claim", "claim_hinted"):
            plan, leased = explained_claim(conn, name, claim_params(2000, uuid4(), **chain))
            assert leased == expected, name
            assert tail_reads(plan) == [("Index Scan", len(every))], name
