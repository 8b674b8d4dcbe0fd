"""The relay's hot path on MySQL 8 and MariaDB: the two-step claim, settle, release, reap, polling.

The claim (seed 004): in one short transaction, lock the candidates with
``SELECT … FOR UPDATE SKIP LOCKED``, choose the runs (relay/store/mysql/runs.py),
set the lease and claim token on the chosen ids, commit. The locking read
brings the rows' columns too, so no read of the claimed rows follows. There is no LISTEN: ``wait`` sleeps, and the relay
polls with its adaptive interval.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any
from uuid import uuid4

from asyncmy.cursors import DictCursor

from relay.config import CONNECT_TIMEOUT_SECONDS, TableName
from relay.errors import ClaimTimeout, StoreError, StoreUnavailable
from relay.store.base import (
    Claim,
    Dead,
    Retry,
    RetryingTopic,
    Settlement,
    Started,
    Status,
    chained_keys,
    oldest_of,
)
from relay.store.mysql import rows as rows_module
from relay.store.mysql import runs as planner
from relay.store.mysql.admin import MySQLAdmin, binary, micros, text
from relay.store.mysql.connection import STATEMENT_TIMEOUT, alongside, error_code, transaction

logger = logging.getLogger(__name__)

# The gauges count exactly up to this many unsent events and estimate past it.
GAUGES_EXACT_UP_TO = 20_000


class BinlogUnsafe(StoreError):
    """Binary logging is statement-based: ``SKIP LOCKED`` is unsafe to replicate that way."""


def check_binlog(log_bin: object, binlog_format: object) -> str | None:
    """Refuse statement-based binary logging; a warning (returned) for MIXED; None when safe.

    With ``binlog_format=STATEMENT`` a replica replays ``SKIP LOCKED`` statements
    against other locks than the source held, and may pick other rows (seed 004).
    MIXED logs such unsafe statements as rows, so it is only warned about.
    """
    if not log_bin or str(log_bin) in ("0", "OFF"):
        return None
    form = str(binlog_format or "").upper()
    if form == "ROW":
        return None
    if form == "STATEMENT":
        raise BinlogUnsafe(
            "binary logging is on with binlog_format=STATEMENT, under which SKIP LOCKED is unsafe to replicate: "
            "set binlog_format=ROW (see docs/mysql.md)"
        )
    return f"binary logging is on with binlog_format={form}: ROW is the safe format for SKIP LOCKED (docs/mysql.md)"


class _RowsFirst(Exception):
    """A claim leased a row that makes no event: roll back, and claim again checking the rows first."""


class MySQLStore(MySQLAdmin):
    """The outbox table in MySQL 8 or MariaDB (the ``Store`` port, and ``Admin`` for retention)."""

    def __init__(
        self,
        url: str,
        table: TableName,
        *,
        owner: str,
        lease_seconds: float,
        keep_sent: bool = False,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        statement_timeout: float | None = None,
    ) -> None:
        super().__init__(url, table, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
        # The lease_owner column is a CHAR(80) whose width never changes (migrations/0007).
        self._owner = owner[:OWNER_CHARS]
        self._lease_seconds = lease_seconds
        self._keep_sent = keep_sent

    async def open(self) -> None:
        """Connect, check the table, and refuse statement-based binary logging."""
        await self._db.open()
        row = (await self._db.fetch("binlog"))[0]
        warning = check_binlog(row["log_bin"], row["binlog_format"])
        if warning:
            logger.warning(warning, extra={"action": "binlog_format"})

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        """Lease up to ``limit`` due events (runs of each key's, at least one, their payloads up to
        ``max_bytes``), by priority then id, each key's in id order; see :meth:`Store.claim`."""
        started = await self.start_claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain)
        return await started.events()

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        """:meth:`claim`, returning once the lease is committed, before the events are built (building a
        claim of thousands of events takes tens of milliseconds of this process, during which the next claim
        can run)."""
        token = uuid4()
        tails = {key: planner.Tail(e.id, e.topic) for key, e in chained_keys(chain).items()}
        mine = tuple(str(claim.token) for claim in chain)
        queries = self._db.queries
        mariadb = self._db.mariadb

        # The payloads and headers the locking read brings along: all of them but those too big for their share
        # of the byte cap, read once the claim has chosen (a claim of big events reads no more than its cap of them).
        inline_bytes = UNBOUNDED_BYTES if max_bytes is None else max(INLINE_BYTES_AT_LEAST, max_bytes // limit)

        async def lease(
            cur: Any, *, checks_first: bool
        ) -> tuple[list[tuple[planner.Candidate, bool]], dict[int, dict[str, Any]], dict[int, str]]:
            params = {
                "max_attempts": max_attempts,
                "limit": limit,
                "inline_bytes": inline_bytes,
                # IN () is no SQL: with no tails, a list that %(tailed)s keeps from mattering.
                "tailed": bool(tails),
                "tail_keys": tuple(binary(key) for key in tails) or (b"",),
            }
            # Rows by column name, made by the driver's own cursor: dicts built in Python from its tuples took
            # twice as long (about 0.7 us a row more, 4,000 rows a claim).
            async with cur.connection.cursor(DictCursor) as by_name:
                await by_name.execute(queries["claim_candidates"], params)
                rows = {r["id"]: r for r in await by_name.fetchall()}
            unusable: dict[int, str] = {}
            candidates = []
            for r in rows.values():
                r["key"] = key = text(r["key"])  # once, for the runs and the events
                r["inline"] = inline = (r["bytes"] is None or r["bytes"] <= inline_bytes) and r["headers"] is not None
                # The checks (rows.unusable) run while the server leases, unless a first try found a row that fails.
                if checks_first and (problem := rows_module.unusable(r, check_payload=mariadb and inline)):
                    unusable[r["id"]] = problem
                candidates.append(
                    planner.Candidate(
                        r["id"],
                        key,
                        r["topic"],
                        r["priority"],
                        int(r["bytes"]) + int(r["headers_bytes"]),
                        bool(r["reaped"]),
                        bool(r["head"]),
                    )
                )
            flying, after_tail = await self._tails(cur, candidates, tails, mine)
            chosen = planner.lone_runs(candidates, tails, flying, after_tail)
            if chosen is None:
                chosen = await self._runs(cur, candidates, tails, flying)
            buried = await self._bury_unusable(cur, chosen, candidates, unusable) if unusable else {}
            placed = planner.within_bytes([c for c in candidates if c.id in chosen], max_bytes)
            late = tuple(c.id for c in placed if not rows[c.id]["inline"])
            if late:
                buried |= await self._read_late_payloads(cur, late, rows, chosen, placed)
                placed = [c for c in placed if c.id in chosen]
            leasing = None
            if placed:
                leasing = cur.execute(
                    queries["claim_lease"],
                    {
                        "token": str(token),
                        "owner": self._owner,
                        "lease_us": micros(self._lease_seconds),
                        "ids": tuple(c.id for c in placed),
                    },
                )
            # The rows still chosen, checked while the server leases (their headers parsed for the events, and
            # on MariaDB their payloads): one that fails (a row the first pass would have buried, cutting its
            # key's run there) sends the claim back to its start. A late row's headers were checked as read.
            later = () if checks_first else [rows[i] for i in chosen]
            checked = (
                rows_module.unusable(r, check_payload=mariadb and r["inline"], check_headers=r["inline"]) for r in later
            )
            if await alongside(leasing, lambda: any(checked)):
                raise _RowsFirst
            return [(c, chosen[c.id]) for c in placed], rows, buried

        async def work(
            cur: Any,
        ) -> tuple[list[tuple[planner.Candidate, bool]], dict[int, dict[str, Any]], dict[int, str]]:
            # The rows were read locked, so they are what the commit leases: no read by token after it.
            try:
                return await transaction(cur, lambda: lease(cur, checks_first=False))
            except _RowsFirst:  # rolled back: again, as the rows that make no event are dead-lettered
                return await transaction(cur, lambda: lease(cur, checks_first=True))

        try:
            placed, rows, buried = await self._db.call("main", work)
            # Logged once committed: a claim retried after a deadlock buries its rows again.
            for event_id, problem in buried.items():
                logger.warning(
                    "dead-lettered event %d at its claim: %s",
                    event_id,
                    problem,
                    extra={"action": "dead_letter", "event_id": event_id},
                )
        except StoreUnavailable as exc:
            if exc.__cause__ is not None and error_code(exc.__cause__) in STATEMENT_TIMEOUT:
                raise ClaimTimeout(f"claiming up to {limit} events: {exc}") from exc
            raise
        return rows_module.Leased(
            token,
            rows,
            [(c.id, chained) for c, chained in placed],
            frozenset(c.id for c, _ in placed if c.reaped),
            len(buried),
        )

    async def _tails(
        self, cur: Any, candidates: Sequence[planner.Candidate], tails: dict[str, planner.Tail], mine: tuple[str, ...]
    ) -> tuple[set[int], dict[int, int]]:
        """Which of this relay's tails of the candidates' keys still hold their lease, and the first unsent
        event of the key after each (a statement of its own sees every event committed before it)."""
        wanted = tuple({tail.id for c in candidates if c.key is not None and (tail := tails.get(c.key))})
        if not wanted or not mine:
            return set(), {}
        await cur.execute(self._db.queries["claim_tails"], {"ids": wanted, "mine": mine})
        after_tail = {int(tail_id): int(after) for tail_id, after in await cur.fetchall()}
        return set(after_tail), after_tail

    async def _runs(
        self, cur: Any, candidates: Sequence[planner.Candidate], tails: dict[str, planner.Tail], flying: set[int]
    ) -> dict[int, bool]:
        """The runs among ``candidates`` (relay/store/mysql/runs.py), from their keys' unsent events read
        again (a statement of its own sees every event committed before it)."""
        keys = {c.key for c in candidates if c.key is not None}
        if not keys:
            return planner.runs(candidates, {}, tails, flying)
        first = min([c.id for c in candidates if c.key is not None] + [t.id for k, t in tails.items() if k in keys])
        await cur.execute(self._db.queries["claim_keys"], {"from": first, "upto": max(c.id for c in candidates)})
        # An event that is not a candidate only ends a run: its topic never matters.
        topics = {c.id: c.topic for c in candidates}
        unsent: dict[str, list[planner.Unsent]] = {}
        for event_id, raw in await cur.fetchall():
            if (key := text(raw)) in keys:
                unsent.setdefault(key, []).append(planner.Unsent(event_id, topics.get(event_id, "")))
        return planner.runs(candidates, unsent, tails, flying)

    async def _read_late_payloads(
        self,
        cur: Any,
        ids: tuple[int, ...],
        rows: dict[int, dict[str, Any]],
        chosen: dict[int, bool],
        placed: Sequence[planner.Candidate],
    ) -> dict[int, str]:
        """Read the payloads and headers of ``ids`` (chosen rows the locking read left one of them out of) into
        ``rows``; dead-letter those no event can be made of as :meth:`_bury_unusable` does (and say which)."""
        await cur.execute(self._db.queries["claim_payloads"], {"ids": ids})
        unusable: dict[int, str] = {}
        for event_id, payload, payload_bytes, headers in await cur.fetchall():
            row = rows[event_id]
            row["payload"], row["payload_bytes"], row["headers"] = payload, payload_bytes, headers
            # The rest of the row was checked with the locking read's rows (_unusable).
            problem = rows_module.headers_problem(row) or (
                rows_module.payload_problem(payload) if self._db.mariadb else None
            )
            if problem is not None:
                unusable[event_id] = problem
        return await self._bury_unusable(cur, chosen, placed, unusable) if unusable else {}

    async def _bury_unusable(
        self, cur: Any, chosen: dict[int, bool], candidates: Sequence[planner.Candidate], unusable: dict[int, str]
    ) -> dict[int, str]:
        """Dead-letter the chosen rows no event can be made of, and take them out of ``chosen``
        with the rest of their key's run: those stay pending, parked behind the dead letter.
        The rows dead-lettered, with why."""
        cut: set[str] = set()
        buried: dict[int, str] = {}
        for candidate in sorted(candidates, key=lambda c: c.id):
            if candidate.id not in chosen:
                continue
            if candidate.key is not None and candidate.key in cut:
                del chosen[candidate.id]
                continue
            problem = unusable.get(candidate.id)
            if problem is None:
                continue
            del chosen[candidate.id]
            if candidate.key is not None:
                cut.add(candidate.key)
            if await cur.execute(self._db.queries["claim_bury"], {"id": candidate.id, "error": problem}):
                buried[candidate.id] = problem
        return buried

    async def settle(
        self, claim: Claim, *, sent: Sequence[int], retry: Sequence[Retry], dead: Sequence[Dead]
    ) -> Settlement:
        """Delete (or mark sent) the acknowledged events, reschedule or dead-letter the rest."""
        token = str(claim.token)
        queries = self._db.queries

        async def steps(cur: Any) -> Settlement:
            done = retried = buried = 0
            if sent:
                done = await cur.execute(
                    queries["ack_keep" if self._keep_sent else "ack_delete"], {"ids": tuple(sent), "token": token}
                )
            for item in retry:
                retried += await cur.execute(
                    queries["retry"],
                    {
                        "id": item.id,
                        "delay_us": micros(item.delay_seconds),
                        "error": item.error,
                        "token": token,
                        "taken_over": item.id in claim.taken_over,
                    },
                )
            for grave in dead:
                buried += await cur.execute(
                    queries["dead_letter"],
                    {"id": grave.id, "error": grave.error, "token": token, "taken_over": grave.id in claim.taken_over},
                )
            lost = len(sent) + len(retry) + len(dead) - done - retried - buried
            return Settlement(sent=done, retried=retried, dead=buried, lost=lost)

        async def work(cur: Any) -> Settlement:
            # One transaction: a deadlock retried runs every step again from the start,
            # instead of finding the rows a first try deleted gone and counting them lost.
            return await transaction(cur, lambda: steps(cur))

        return await self._db.call("settle", work)

    async def renew(self, claim: Claim) -> set[int]:
        """Start the lease again for the claim's events it still holds; their ids."""
        if not claim.events:
            return set()
        queries = self._db.queries
        params = {"ids": tuple(e.id for e in claim.events), "token": str(claim.token)}

        async def work(cur: Any) -> set[int]:
            async def steps() -> set[int]:
                await cur.execute(queries["renew_select"], params)
                held = tuple(int(row[0]) for row in await cur.fetchall())
                if held:
                    await cur.execute(queries["renew"], {"ids": held, "lease_us": micros(self._lease_seconds)})
                return set(held)

            return await transaction(cur, steps)

        return await self._db.call("settle", work)

    async def release(self, claim: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Give unpublished events back without counting the attempt, due again after ``delay_seconds``."""
        if ids:
            params = {
                "ids": tuple(ids),
                "token": str(claim.token),
                "delay_us": micros(delay_seconds),
                # IN () is no SQL: no id is 0.
                "taken_over": tuple(claim.taken_over) or (0,),
            }
            await self._db.run("release", params, lane="settle")

    async def reap(self, *, max_attempts: int) -> int:
        """Dead-letter events whose expired lease used their last attempt."""
        return await self._db.run("reap_exhausted", {"max_attempts": max_attempts})

    async def wait(self, timeout: float) -> bool:
        """MySQL has no LISTEN: sleep ``timeout`` (the relay's adaptive poll interval)."""
        await asyncio.sleep(timeout)
        return False

    async def gauges(self, *, exact_up_to: int = GAUGES_EXACT_UP_TO) -> Status:
        """``status`` at a bounded cost: exact up to ``exact_up_to`` unsent events, estimated past it."""
        db, bound = self._db, {"limit": exact_up_to + 1}
        head = (await db.fetch("gauges_head", bound, lane="stats"))[0]
        failed = (await db.fetch("gauges_failed", lane="stats"))[0]
        waiting = (await db.fetch("gauges_keys_waiting", bound, lane="stats"))[0]
        unsent, in_flight = int(head["unsent"]), int(head["in_flight"])
        if unsent > exact_up_to:
            names = {"schema": db.table.schema, "name": db.table.name}
            unsent = max(unsent, int((await db.fetch("gauges_estimate", names, lane="stats"))[0]["estimate"]))
        retrying = tuple(
            RetryingTopic.counted(text(r["topic"]), r["retrying"], r["oldest_age_seconds"])
            for r in await db.fetch("gauges_retrying", {"limit": exact_up_to}, lane="stats")
        )
        return Status(
            pending=unsent - in_flight,
            in_flight=in_flight,
            failed=int(failed["failed"]),
            oldest_pending_age_seconds=await self.oldest_pending_age(),
            parked_keys=int(failed["parked_keys"]),
            scheduled=int(head["scheduled"]),
            keys_waiting_on_schedule=int(waiting["waiting"]),
            retrying=sum(r.retrying for r in retrying),
            oldest_retrying_age_seconds=oldest_of(retrying),
            retrying_topics=retrying,
        )

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the database answers, has the table and takes writes."""
        await self._db.run("check_writable")


#: A claim's locking read brings each payload, and headers, of up to this many bytes along, or up to the byte cap's
#: share of each event of the batch if that is more (relay/store/mysql/queries.sql, claim_candidates).
INLINE_BYTES_AT_LEAST = 4096
#: The most of the relay's owner (host:pid, for operators) the lease writes: lease_owner is a CHAR(80).
OWNER_CHARS = 80
#: "No byte cap" to the claim's SQL.
UNBOUNDED_BYTES = 2**62
