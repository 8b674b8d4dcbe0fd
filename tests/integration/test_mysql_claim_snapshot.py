"""What the MySQL claim's per-key guard takes from the server: one snapshot for a whole statement.

``claim_candidates`` (relay/store/mysql/queries.sql) locks its rows with FOR UPDATE SKIP LOCKED and decides
each keyed row's turn with subqueries that lock nothing: the key's oldest pending event, its oldest dead
letter, and whether the table holds a dead letter at all (uncorrelated, evaluated once a statement). Those
answers agree with one another only if every subquery of the statement reads the same snapshot. Were a
probe to read the rows as committed when it runs, an older event of the key dead-lettered while the claim
ran would pass both checks (the once-a-statement "no dead letter" read before, the key's pending probe
after) and its later events would go out with the key not parked.

Here, on the server the tests run on (MariaDB 10.11; MySQL 8's manual says the same of InnoDB under READ
COMMITTED), another transaction changes the older event of every key while one such statement runs: after
its first row's probes (it waits until the statement sleeps on that row) and before the next rows'. Each
row has a key of its own, so no probe's answer is reused from another row (MariaDB caches a correlated
subquery's result by its outer values). Every row must report its key as the statement's start saw it, for
each kind of change the relay meets; and under READ UNCOMMITTED, which reads without a snapshot, the same
run must see the change in the later rows, or the test could not tell the two apart.

The statement reads its rows by id from past the changed ones (FORCE INDEX), so that it holds no lock the
change waits for: the claim's own scan of the pending rows locks each as it passes (the change would wait
for the claim to commit, which guards the key too, but is not what is checked here).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pymysql.cursors
import pytest

from tests import mysql_support

#: The claim's probes, in its shapes, before the pause so that each row reports what they read when it came.
STATEMENT = """
SELECT o.id, o.`key`,
       SYSDATE(6) AS read_at,
       (SELECT p.id FROM outbox AS p WHERE p.`key` = o.`key` AND p.state = 'pending' ORDER BY p.id LIMIT 1) AS head,
       (SELECT d.id FROM outbox AS d WHERE d.`key` = o.`key` AND d.state = 'failed' ORDER BY d.id LIMIT 1) AS dead,
       NOT EXISTS (SELECT 1 FROM outbox AS n WHERE n.state = 'failed') AS no_dead_letter,
       SLEEP(%(pause)s) AS paused
FROM outbox AS o FORCE INDEX (PRIMARY)
WHERE o.id > %(last_older)s AND o.state = 'pending'
ORDER BY o.id
FOR UPDATE SKIP LOCKED
"""

#: What another transaction does to each key's older event while the statement runs.
CHANGES = {
    "dead-lettered": "UPDATE outbox SET state = 'failed', failed_at = UTC_TIMESTAMP(6) WHERE id IN %s",
    "delivered": "DELETE FROM outbox WHERE id IN %s",
    "requeued": "UPDATE outbox SET state = 'pending', failed_at = NULL WHERE id IN %s",
}

PAUSE = 0.4
KEYS = 3


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("isolation", ["READ COMMITTED", "READ UNCOMMITTED"])
def test_a_claim_statement_reads_one_snapshot_whatever_commits_while_it_runs(
    mysql_url: str, change: str, isolation: str
) -> None:
    keys = [f"k{n}" for n in range(KEYS)]
    rows = [("t", key, "{}", f"older-{key}") for key in keys] + [("t", key, "{}", f"later-{key}") for key in keys]
    mysql_support.insert_many(mysql_url, mysql_support.INSERT_EVENT, rows)
    older = [row[0] for row in mysql_support.execute(mysql_url, "SELECT id FROM outbox ORDER BY id")][:KEYS]
    if change == "requeued":
        mysql_support.execute(mysql_url, CHANGES["dead-lettered"], (older,))
    before = {key: _probes(mysql_url, key) for key in keys}

    claim = mysql_support.connect(mysql_url, autocommit=False)
    with claim.cursor() as cur:
        cur.execute("SELECT CONNECTION_ID()")
        (claim_id,) = cur.fetchone()
    committed: list[datetime] = []

    def other_transaction() -> None:
        conn = mysql_support.connect(mysql_url)
        try:
            with conn.cursor() as cur:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # the first row read: the statement sleeps on it
                    cur.execute("SELECT state FROM information_schema.PROCESSLIST WHERE id = %s", (claim_id,))
                    if (cur.fetchone() or ("",))[0] == "User sleep":
                        break
                    time.sleep(0.005)
                cur.execute(CHANGES[change], (older,))
                cur.execute("SELECT SYSDATE(6)")
                committed.append(cur.fetchone()[0])
        finally:
            conn.close()

    other = threading.Thread(target=other_transaction)
    try:
        with claim.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {isolation}")
            claim.begin()
            other.start()
            cur.execute(STATEMENT, {"pause": PAUSE, "last_older": older[-1]})
            read: list[dict[str, Any]] = list(cur.fetchall())
        claim.commit()
    finally:
        other.join()
        claim.close()

    assert committed, "the other transaction did not commit"
    late = [row for row in read if row["read_at"] > committed[0]]
    assert len(read) == KEYS and read[0]["read_at"] < committed[0] and len(late) == KEYS - 1, (read, committed)
    read_keys = [row["key"].decode() if isinstance(row["key"], bytes) else row["key"] for row in read]
    seen = [(row["head"], row["dead"], row["no_dead_letter"]) for row in read]
    as_before = [before[key] for key in read_keys]
    if isolation == "READ COMMITTED":
        assert seen == as_before, change
    else:  # no snapshot: the rows read after the commit see it
        assert seen[0] == as_before[0] and all(s != b for s, b in zip(seen[1:], as_before[1:], strict=True)), change
    assert all(_probes(mysql_url, key) != before[key] for key in read_keys), "a change the probes see"


def _probes(url: str, key: str) -> tuple[Any, Any, Any]:
    """The key's probes, read now in a statement of their own."""
    [row] = mysql_support.execute(
        url,
        "SELECT (SELECT p.id FROM outbox AS p WHERE p.`key` = %(k)s AND p.state = 'pending' ORDER BY p.id LIMIT 1),"
        " (SELECT d.id FROM outbox AS d WHERE d.`key` = %(k)s AND d.state = 'failed' ORDER BY d.id LIMIT 1),"
        " NOT EXISTS (SELECT 1 FROM outbox AS n WHERE n.state = 'failed')",
        {"k": key},
    )
    return row
