"""What operators and the relay's gauges read: counts, parked and scheduled keys, the oldest pending age."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from psycopg.rows import dict_row

from relay.store.base import RetryingTopic, Status, TopicLag, oldest_of
from relay.store.postgres.connection import Database, column_of

# The gauges count exactly up to this many unsent events (a bounded read of
# the claim index, 10 to 20 ms here) and estimate past it: see the gauges query.
GAUGES_EXACT_UP_TO = 20_000


async def status(db: Database, *, topics: int = 0) -> Status:
    """Exact counts: one pass over the unsent rows; with ``topics``, two more for that many topics' lag
    and retrying events."""
    row = (await db.fetch("status", {}, dict_row, lane="stats"))[0]
    found = await _status(db, row, pending=row["pending"], retrying=row["retrying"])
    found = replace(found, oldest_retrying_age_seconds=row["oldest_retrying_age_seconds"])
    if not topics:
        return found
    retrying = await db.fetch("retrying_topics", {"limit": topics}, dict_row, lane="stats")
    lag = await db.fetch("topic_lag", {"limit": topics}, dict_row, lane="stats")
    return replace(
        found,
        retrying_topics=tuple(RetryingTopic(**r) for r in retrying),
        topics=tuple(TopicLag(r["topic"], r["pending"], r["oldest_pending_age_seconds"]) for r in lag),
        topic_count=lag[0]["topic_count"] if lag else 0,
    )


async def gauges(db: Database, *, exact_up_to: int = GAUGES_EXACT_UP_TO) -> Status:
    """``status`` at a bounded cost: exact up to ``exact_up_to`` unsent events, estimated past it."""
    params = {
        "exact_up_to": exact_up_to,
        "table_name": ".".join(f'"{part}"' for part in db.table.parts),
        # The column whose statistics give the share of unsent rows (Debezium's layout prefixes the relay's).
        "state_column": "relay_state" if db.layout.debezium else "state",
    }
    row = (await db.fetch("gauges", params, dict_row, lane="stats"))[0]
    unsent = row["unsent"]
    if unsent > exact_up_to:
        unsent = max(unsent, row["unsent_estimate"])
    retrying = await db.fetch("gauges_retrying", {"exact_up_to": exact_up_to}, dict_row, lane="stats")
    found = await _status(db, row, pending=unsent - row["in_flight"], retrying=sum(r["retrying"] for r in retrying))
    topics = tuple(RetryingTopic.counted(r["topic"], r["retrying"], r["oldest_age_seconds"]) for r in retrying)
    return replace(found, retrying_topics=topics, oldest_retrying_age_seconds=oldest_of(topics))


async def _status(db: Database, row: dict[str, Any], *, pending: int, retrying: int) -> Status:
    """A ``Status`` from a status or gauges row, with the oldest pending age read now."""
    return Status(
        retrying=retrying,
        pending=pending,
        in_flight=row["in_flight"],
        failed=row["failed"],
        oldest_pending_age_seconds=await oldest_pending_age(db),
        parked_keys=row["parked_keys"],
        scheduled=row["scheduled"],
        keys_waiting_on_schedule=row["keys_waiting_on_schedule"],
    )


async def oldest_pending_age(db: Database) -> float:
    """Seconds since the oldest due event that no live lease holds was written (index probes)."""
    return float((await db.fetch("oldest_pending_age", {}, column_of("age", float), lane="stats"))[0])
