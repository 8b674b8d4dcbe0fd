"""The SQL stores' claims against the memory store's, on random histories.

The conformance tests pin the claim rules one at a time; here PostgreSQL and
MySQL replay random histories (keys, topics, priorities, events not yet due,
chained claims, retries, dead letters, expired leases) beside the memory store,
the readable model of those rules, and must claim the same events, in the same
order, chained the same way, and settle them alike, at every step.
"""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relay.store.base import Claim, Dead, Retry
from tests.conformance import harness as harnesses
from tests.conformance.harness import MAX, Harness, MemoryHarness, MySQLHarness, PostgresHarness, run

#: Histories that go on from batches in flight at least twice (the test checks that they do).
SEEDS = (0, 4, 5, 8, 9, 10, 11, 13, 14, 16, 19, 21)
STEPS = 80
FATES = ("sent", "retry", "dead")


def claimed(claim: Claim) -> list[tuple[str, bool]]:
    return [(e.idempotency_key, e.chained) for e in claim.events]


class Replay:
    """One random history, played step by step on the model and on a SQL store."""

    def __init__(self, seed: int, model: Harness, sql: Harness) -> None:
        self.rng = random.Random(seed)
        self.harnesses = (model, sql)
        #: Per harness, the claims not settled yet, by the step that made them.
        self.open: tuple[dict[int, Claim], dict[int, Claim]] = ({}, {})
        self.history: list[str] = []
        #: The key of each event, by idempotency key.
        self.keys: dict[str, str | None] = {}
        self.made = self.claimed = self.chained_on = 0

    def keys_of(self, events: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
        """``(key, chained)`` of each keyed event of a claim, by the keys the history gave them."""
        keyed = ((self.keys[idem], chained) for idem, chained in events)
        return [(key, chained) for key, chained in keyed if key is not None]

    def agree(self, what: str, model: object, sql: object) -> None:
        assert sql == model, f"{what}: the model says {model}, the SQL store {sql}, after\n" + "\n".join(self.history)

    def step(self, n: int) -> None:
        roll = self.rng.random()
        if roll < 0.4:
            self.insert(n)
        elif roll < 0.75:
            self.claim(n)
        elif roll < 0.93 and self.open[0]:
            self.settle(n)
        elif roll < 0.97:
            for harness, claims in zip(self.harnesses, self.open, strict=True):
                harness.expire_leases()
                claims.clear()  # a relay stops going on from batches whose leases ended
            self.history.append(f"{n}: leases expire")
        else:
            for harness in self.harnesses:
                harness.make_due()
            self.history.append(f"{n}: everything due")

    def insert(self, n: int) -> None:
        """A burst of one to four events of one key (or without one), so that keys get runs."""
        key = self.rng.choice(["a", "a", "b", "c", None])
        topic = "u" if self.rng.random() < 0.1 else "t"
        for _ in range(self.rng.randint(1, 4)):
            self.made += 1
            kw: dict[str, Any] = {"key": key, "idempotency_key": f"e{self.made}"}
            self.keys[kw["idempotency_key"]] = key
            if self.rng.random() < 0.1:
                kw["priority"] = 5
            if self.rng.random() < 0.05:
                kw["deliver_at"] = datetime.now(UTC) + timedelta(hours=1)
            for harness in self.harnesses:
                harness.insert(topic, {"n": self.made}, **kw)
            self.history.append(f"{n}: insert to {topic} {kw}")

    def claim(self, n: int) -> None:
        limit = self.rng.randint(1, 8)
        chain = [step for step in sorted(self.open[0]) if self.rng.random() < 0.9]
        got = []
        for harness, claims in zip(self.harnesses, self.open, strict=True):
            claim = run(harness.store.claim(limit, max_attempts=MAX, chain=[claims[step] for step in chain]))
            got.append(claimed(claim))
            if claim.events:
                claims[n] = claim
        self.history.append(f"{n}: claim {limit} chained on the claims of steps {chain}: {got[0]}")
        self.agree("claims", *got)
        self.claimed += len(got[0])
        # Runs that go on from a batch in flight: chained from their first event on.
        firsts = {key: chained for key, chained in reversed(self.keys_of(got[0]))}
        self.chained_on += sum(1 for chained in firsts.values() if chained)

    def settle(self, n: int) -> None:
        which = self.rng.choice(sorted(self.open[0]))
        fates = {key: self.rng.choices(FATES, [0.8, 0.13, 0.07])[0] for key, _ in claimed(self.open[0][which])}
        self.history.append(f"{n}: settle the claim of step {which}: {fates}")
        settled = []
        for harness, claims in zip(self.harnesses, self.open, strict=True):
            claim = claims.pop(which)
            ids = {fate: [e.id for e in claim.events if fates[e.idempotency_key] == fate] for fate in FATES}
            settlement = run(harness.store.settle(
                claim,
                sent=ids["sent"],
                retry=[Retry(i, 0.0, "again") for i in ids["retry"]],
                dead=[Dead(i, "poison") for i in ids["dead"]],
            ))  # fmt: skip
            settled.append(settlement)
        self.agree("settles", *settled)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("store", ["postgres", "mysql"])
def test_the_sql_claim_agrees_with_the_memory_store_on_random_histories(
    store: str, seed: int, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql: Harness
    if store == "postgres":
        sql = PostgresHarness(request.getfixturevalue("database_url"))
        # Every claim a full scan: a hinted one may leave out, until the next full scan, rows
        # below the floor or of a priority no claim has returned yet (relay/store/floor.py).
        monkeypatch.setattr(sql.store._floor, "next_after", lambda: 0)
    else:
        sql = MySQLHarness(request.getfixturevalue("mysql_url"))
    replay = Replay(seed, MemoryHarness(), sql)
    with asyncio.Runner() as runner:  # one loop throughout, as in a relay (see the harness)
        harnesses.runner = runner
        try:
            run(sql.store.open())
            try:
                for n in range(STEPS):
                    replay.step(n)
            finally:
                run(sql.store.close())
        finally:
            harnesses.runner = None
    # A history that claimed nothing, or never went on from a batch in flight, would prove little.
    assert replay.claimed > 0
    assert replay.chained_on >= 2
