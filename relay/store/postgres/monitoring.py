"""What operators and the relay's gauges read: counts, parked and scheduled keys, the oldest pending age."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from relay.store.base import Status
from relay.store.postgres.connection import Database, column_of

# The gauges count exactly up to this many unsent events (a bounded read of
# the claim index, 10 to 20 ms here) and estimate past it: see the gauges query.
GAUGES_EXACT_UP_TO = 20_000


async def status(db: Database) -> Status:
    """Exact counts: one pass over the unsent rows."""
    row = (await db.fetch("status", {}, dict_row, lane="stats"))[0]
    return await _status(db, row, pending=row["pending"])


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
    return await _status(db, row, pending=unsent - row["in_flight"])


async def _status(db: Database, row: dict[str, Any], *, pending: int) -> Status:
    """A ``Status`` from a status or gauges row, with the oldest pending age read now."""
    return Status(
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
