"""The relay's hot path on MySQL 8 and MariaDB: the two-step claim, settle, release, reap, polling.

The claim (seed 004): in one short transaction, lock the candidates with
``SELECT … FOR UPDATE SKIP LOCKED``, choose the runs (relay/store/mysql/runs.py),
set the lease and claim token on the chosen ids, commit. The locking read
brings the rows' columns too, so no read of the claimed rows follows. There is no LISTEN: ``wait`` sleeps, and the relay
polls with its adaptive interval.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import uuid4

from relay.config import CONNECT_TIMEOUT_SECONDS, TableName
from relay.errors import ClaimTimeout, StoreError, StoreUnavailable
from relay.events import Event
from relay.store.base import (
    Built,
    Claim,
    Dead,
    Retry,
    RetryingTopic,
    Settlement,
    Started,
    Status,
    chained_keys,
    in_key_order,
    next_attempt,
    oldest_of,
    undecodable,
)
from relay.store.mysql import runs as planner
from relay.store.mysql.admin import MySQLAdmin, binary, micros, text, utc
from relay.store.mysql.connection import STATEMENT_TIMEOUT, error_code, rows_of, transaction

logger = logging.getLogger(__name__)

#: How MySQL 8 and MariaDB both write an empty JSON object.
EMPTY_JSON_OBJECT = "{}"
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
        self._owner = owner
        self._lease_seconds = lease_seconds
        self._keep_sent = keep_sent

    async def open(self) -> None:
        """Connect, check the table, and refuse statement-based binary logging."""
        await self._db.open()
        row = (await self._db.fetch("binlog"))[0]
        warning = check_binlog(row["log_bin"], row["binlog_format"])
        if warning:
            logger.warning(warning, extra={"action": "binlog_format"})

    async def start_claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Started:
        """:meth:`claim`, its events built at once."""
        return Built(await self.claim(limit, max_attempts=max_attempts, max_bytes=max_bytes, chain=chain))

    async def claim(
        self, limit: int, *, max_attempts: int, max_bytes: int | None = None, chain: Sequence[Claim] = ()
    ) -> Claim:
        """Lease up to ``limit`` due events (runs of each key's, at least one, their payloads up to
        ``max_bytes``), by priority then id, each key's in id order; see :meth:`Store.claim`."""
        token = uuid4()
        tails = {key: planner.Tail(e.id, e.topic) for key, e in chained_keys(chain).items()}
        mine = tuple(str(claim.token) for claim in chain)
        queries = self._db.queries

        # The payloads and headers the locking read brings along: all of them but those too big for their share
        # of the byte cap, read once the claim has chosen (a claim of big events reads no more than its cap of them).
        inline_bytes = UNBOUNDED_BYTES if max_bytes is None else max(INLINE_BYTES_AT_LEAST, max_bytes // limit)

        async def lease(
            cur: Any,
        ) -> tuple[list[tuple[planner.Candidate, bool]], dict[int, dict[str, Any]], dict[int, str]]:
            params = {
                "max_attempts": max_attempts,
                "limit": limit,
                "inline_bytes": inline_bytes,
                # IN () is no SQL: with no tails, a list that %(tailed)s keeps from mattering.
                "tailed": bool(tails),
                "tail_keys": tuple(binary(key) for key in tails) or (b"",),
            }
            await cur.execute(queries["claim_candidates"], params)
            rows = {r["id"]: r for r in rows_of(cur, await cur.fetchall())}
            unusable: dict[int, str] = {}
            for r in rows.values():
                r["key"] = text(r["key"])  # once, for the runs and the events
                r["inline"] = (r["bytes"] is None or int(r["bytes"]) <= inline_bytes) and r["headers"] is not None
                problem = _unusable(r, check_payload=self._db.mariadb and r["inline"])
                if problem is not None:
                    unusable[r["id"]] = problem
            candidates = [
                planner.Candidate(
                    r["id"],
                    r["key"],
                    r["topic"],
                    r["priority"],
                    int(r["bytes"]) + int(r["headers_bytes"]),
                    bool(r["reaped"]),
                    _previous(r["prev_pending"], r["prev_failed"]),
                )
                for r in rows.values()
            ]
            keyed = [r for r in rows.values() if r["key"] is not None]
            if all(r["seen"] for r in keyed):
                unsent = planner.unsent_of(candidates)
            else:
                unsent = {}
                await cur.execute(
                    queries["claim_keys"],
                    {"keys": tuple({r["key"] for r in keyed}), "upto": max(c.id for c in candidates)},
                )
                for row in await cur.fetchall():
                    unsent.setdefault(text(row[1]), []).append(planner.Unsent(row[0], row[2]))
            flying: set[int] = set()
            wanted = tuple(tail.id for key, tail in tails.items() if key in unsent)
            if wanted and mine:
                await cur.execute(queries["claim_tails"], {"ids": wanted, "mine": mine})
                flying = {row[0] for row in await cur.fetchall()}
            chosen = planner.runs(candidates, unsent, tails, flying)
            buried = await self._bury_unusable(cur, chosen, candidates, unusable) if unusable else {}
            placed = planner.within_bytes([c for c in candidates if c.id in chosen], max_bytes)
            late = tuple(c.id for c in placed if not rows[c.id]["inline"])
            if late:
                buried |= await self._read_late_payloads(cur, late, rows, chosen, placed)
                placed = [c for c in placed if c.id in chosen]
            if placed:
                await cur.execute(
                    queries["claim_lease"],
                    {
                        "token": str(token),
                        "owner": self._owner,
                        "lease_us": micros(self._lease_seconds),
                        "ids": tuple(c.id for c in placed),
                    },
                )
            return [(c, chosen[c.id]) for c in placed], rows, buried

        async def work(
            cur: Any,
        ) -> tuple[list[tuple[planner.Candidate, bool]], dict[int, dict[str, Any]], dict[int, str]]:
            # The rows were read locked, so they are what the commit leases: no read by token after it.
            return await transaction(cur, lambda: lease(cur))

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
        chained, reaped = {c.id: flag for c, flag in placed}, {c.id for c, _ in placed if c.reaped}
        # The lease counted an attempt after the rows were read.
        events = [
            self._event(rows[c.id], chained=chained[c.id], attempts=next_attempt(rows[c.id]["attempts"]))
            for c, _ in placed
        ]
        priority = {c.id: c.priority for c, _ in placed}
        events = in_key_order(events, lambda e: (-priority[e.id], e.id), event=lambda e: e)
        return Claim(token=token, events=events, reaped=sum(1 for e in events if e.id in reaped), buried=len(buried))

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
            problem = _headers_problem(row) or (_payload_problem(payload) if self._db.mariadb else None)
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

    @staticmethod
    def _event(row: dict[str, Any], *, chained: bool, attempts: int) -> Event:
        # Parsed when the claim checked the row (_unusable); most events have no headers.
        headers = row["headers_parsed"]
        payload = row["payload"]
        return Event(
            id=row["id"],
            topic=row["topic"],
            key=row["key"],
            # JSON as text, or (payload NULL) bytes as they are, with their content type.
            payload=bytes(row["payload_bytes"]) if payload is None else _utf8(payload),
            headers={name: value if isinstance(value, str) else json.dumps(value) for name, value in headers.items()},
            idempotency_key=text(row["idempotency_key"]),
            attempts=attempts,
            created_at=utc(row["created_at"]),
            chained=chained,
            content_type=row["content_type"],
        )

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
                    {"id": item.id, "delay_us": micros(item.delay_seconds), "error": item.error, "token": token},
                )
            for grave in dead:
                buried += await cur.execute(
                    queries["dead_letter"], {"id": grave.id, "error": grave.error, "token": token}
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
            params = {"ids": tuple(ids), "token": str(claim.token), "delay_us": micros(delay_seconds)}
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
#: "No byte cap" to the claim's SQL.
UNBOUNDED_BYTES = 2**62

#: How much of a bad key's bytes a dead letter's error shows.
SHOWN_BYTES = 64


def _previous(pending: int | None, failed: int | None) -> int | None:
    """The later of a key's pending and dead-lettered events just before a candidate (None: neither)."""
    return max((int(found) for found in (pending, failed) if found is not None), default=None)


def _unusable(row: dict[str, Any], *, check_payload: bool) -> str | None:
    """Why no event can be made of a claimed row (None: it can), with its headers parsed into ``headers_parsed``.

    The table's checks leave room for rows the relay cannot send as the
    contract says: ``key`` and ``idempotency_key`` are VARBINARY, so a writer
    whose connection is not UTF-8 can store bytes that are not text; and
    MariaDB's JSON check takes some text that is not JSON (``{"a":1e}``,
    ``[-]``, ``"\\q"``), in ``headers`` and in ``payload``, and a zero
    ``created_at`` (``0000-00-00``, which the driver gives as text). Such a row is
    dead-lettered at its claim, with this for its error. MySQL 8 keeps JSON in
    a binary form and gives it back as JSON it wrote itself: ``check_payload``
    (parsing every payload) is for MariaDB, which keeps the text as written.
    """
    for column in ("key", "idempotency_key"):
        value = text(row[column])
        if undecodable(value):
            raw = value.encode("utf-8", "surrogateescape")
            more = "..." if len(raw) > SHOWN_BYTES else ""
            return f"{column} is not valid UTF-8 (its bytes in hex: {raw[:SHOWN_BYTES].hex()}{more})"
    if not isinstance(row["created_at"], datetime):  # a zero date, which MariaDB's default sql_mode lets in
        return f"created_at is not a date: {str(row['created_at'])[:40]!r}"
    return _headers_problem(row) or (_payload_problem(row["payload"]) if check_payload else None)


def _headers_problem(row: dict[str, Any]) -> str | None:
    """Why a row's headers make no event (None: they do), with them parsed into ``headers_parsed``.

    Headers the locking read left out (``None``: too big to bring along) parse as none until they are read.
    """
    headers = row["headers"]
    row["headers_parsed"] = {}
    if headers and headers != EMPTY_JSON_OBJECT:
        try:
            parsed = json.loads(headers, parse_int=_int_or_digits)
        except ValueError as exc:
            return f"headers are not valid JSON, though the database took them: {exc}"
        if not isinstance(parsed, dict):
            return "headers are not a JSON object"
        for name, value in parsed.items():
            if not isinstance(value, str) and not _finite(value):
                return f"header {name[:100]!r} is a number JSON cannot carry (it parses as {value!r})"
        row["headers_parsed"] = parsed
    return None


def _payload_problem(payload: str | bytes | None) -> str | None:
    """Why a JSON payload MariaDB took is no JSON (None: it is, or the row has a bytes payload)."""
    if payload is None:
        return None
    try:
        json.loads(payload, parse_int=_unconverted)  # validity only: no int(), and so no digit limit
    except ValueError as exc:
        return f"payload is not valid JSON, though the database took it: {exc}"
    return None


#: Python's int() refuses longer digit strings (sys.get_int_max_str_digits, 4,300); JSON has no limit.
_INT_DIGITS_MAX = 4000


class _Digits(str):
    """A JSON integer too long for ``int()``, kept as its text: a header value is sent as its JSON text."""

    __slots__ = ()


def _int_or_digits(text: str) -> int | str:
    return int(text) if len(text) <= _INT_DIGITS_MAX else _Digits(text)


def _unconverted(text: str) -> int:
    return 0


def _finite(value: Any) -> bool:
    """Whether ``value``, a parsed header, is written back as JSON (1e400 parses as inf, which is not)."""
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _utf8(json_text: str | bytes) -> bytes:
    """A JSON payload's text as UTF-8: a driver may give it as bytes where the server typed it binary."""
    return json_text.encode() if isinstance(json_text, str) else bytes(json_text)
