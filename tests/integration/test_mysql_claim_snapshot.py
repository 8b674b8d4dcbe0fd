"""What the MySQL claim's per-key guard takes from the server: one snapshot for a whole statement.

``claim_candidates`` (relay/store/mysql/queries.sql) locks its rows with FOR UPDATE SKIP LOCKED and decides
each keyed row's turn with subqueries that lock nothing: the key's oldest pending event, its oldest dead
letter, and whether the table holds a dead letter at all (uncorrelated, evaluated once a statement). Those
answers agree with one another only if every subquery of the statement reads the same snapshot. Were a
probe to read the rows as committed when it runs, an older event of the key dead-lettered while the claim
ran would pass both checks (the once-a-statement "no dead letter" read before, the key's pending probe
after) and its later events would go out with the key not parked.

Here, on the server the tests run on (MariaDB 10.11; MySQL 8's manual says the same of InnoDB under READ
COMMITTED), another transaction changes an older event of the key while one such statement runs, after
its first row and before its later ones (SLEEP per row; SYSDATE(6) says when each row was read): every
row must report the key as the statement's start saw it. For each kind of change the relay meets.
The statement reads its rows by id from past the changed one (FORCE INDEX), so that it holds no lock the
change waits for: the claim's own scan of the pending rows locks each as it passes (the change would wait for
the claim to commit, which guards the key too, but is not what is checked here).
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pymysql.cursors
import pytest

from relay.store.mysql.connection import session_settings
from tests import mysql_support

#: The claim's probes, in its shapes, in the select list so that each row reports what they read.
STATEMENT = """
SELECT o.id,
       SLEEP(%(pause)s) AS paused,
       SYSDATE(6) AS read_at,
       (SELECT p.id FROM outbox AS p WHERE p.`key` = o.`key` AND p.state = 'pending' ORDER BY p.id LIMIT 1) AS head,
       (SELECT d.id FROM outbox AS d WHERE d.`key` = o.`key` AND d.state = 'failed' ORDER BY d.id LIMIT 1) AS dead,
       NOT EXISTS (SELECT 1 FROM outbox AS n WHERE n.state = 'failed') AS no_dead_letter
FROM outbox AS o FORCE INDEX (PRIMARY)
WHERE o.id > %(first)s AND o.state = 'pending'
ORDER BY o.id
FOR UPDATE SKIP LOCKED
"""

#: What another transaction does to the key's oldest event (id ``first``) while the statement runs.
CHANGES = {
    "dead-lettered": "UPDATE outbox SET state = 'failed', failed_at = UTC_TIMESTAMP(6) WHERE id = %s",
    "delivered": "DELETE FROM outbox WHERE id = %s",
    "requeued": "UPDATE outbox SET state = 'pending', failed_at = NULL WHERE id = %s",
}

PAUSE = 0.5
ROWS = 4


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_claim_statement_reads_one_snapshot_whatever_commits_while_it_runs(mysql_url: str, change: str) -> None:
    first_state = "failed" if change == "requeued" else "pending"
    mysql_support.insert_many(
        mysql_url, mysql_support.INSERT_EVENT, [("t", "k", "{}", f"e{n}") for n in range(ROWS + 1)]
    )
    first = min(row[0] for row in mysql_support.execute(mysql_url, "SELECT id FROM outbox"))
    if first_state == "failed":
        mysql_support.execute(mysql_url, CHANGES["dead-lettered"], (first,))
    before = _probes(mysql_url)

    committed: list[datetime] = []

    def other_transaction() -> None:
        time.sleep(PAUSE * 1.5)  # after the statement's first row, before its second
        conn = mysql_support.connect(mysql_url)
        try:
            with conn.cursor() as cur:
                cur.execute(CHANGES[change], (first,))
                cur.execute("SELECT SYSDATE(6)")
                committed.append(cur.fetchone()[0])
        finally:
            conn.close()

    claim = mysql_support.connect(mysql_url, autocommit=False)
    other = threading.Thread(target=other_transaction)
    try:
        with claim.cursor(pymysql.cursors.DictCursor) as cur:
            for statement in session_settings(mariadb=True, statement_timeout=30.0)[:1]:  # READ COMMITTED
                cur.execute(statement)
            claim.begin()
            other.start()
            cur.execute(STATEMENT, {"pause": PAUSE, "first": first})
            rows: list[dict[str, Any]] = list(cur.fetchall())
        claim.commit()
    finally:
        other.join()
        claim.close()

    assert committed, "the other transaction did not commit"
    late = [row for row in rows if row["read_at"] > committed[0]]
    early = [row for row in rows if row["read_at"] < committed[0]]
    assert early and late, f"the change must commit between the statement's rows: {rows}, {committed}"
    for row in rows:
        assert (row["head"], row["dead"], row["no_dead_letter"]) == before, (change, row, before)
    after = _probes(mysql_url)
    assert after != before, "the change must be one the probes see once it is committed"


def _probes(url: str) -> tuple[Any, Any, Any]:
    """The key's probes, read now in a statement of their own (for any later row of the key)."""
    [row] = mysql_support.execute(
        url,
        "SELECT (SELECT p.id FROM outbox AS p WHERE p.`key` = 'k' AND p.state = 'pending' ORDER BY p.id LIMIT 1),"
        " (SELECT d.id FROM outbox AS d WHERE d.`key` = 'k' AND d.state = 'failed' ORDER BY d.id LIMIT 1),"
        " NOT EXISTS (SELECT 1 FROM outbox AS n WHERE n.state = 'failed')",
    )
    return row
