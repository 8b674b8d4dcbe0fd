"""Events handed over to the outbox table, delivered from it by the slot's reader.

A dead letter parks its key: the key's later events read from the log are
written into the table behind it (``pending``, with a ``last_error`` saying
why, new ids in the order read). ``requeue`` makes the dead letter pending
again, ``skip`` sets it aside; then the rows of the key may go, and the leader
sends them from the table, first of each key first, deleting each once
acknowledged. While the table holds rows of a key (dead, or waiting behind
one), the key's events from the log go to the table too, so the key's order
holds across the two paths.
"""

from __future__ import annotations

import logging

from relay.backoff import Backoff
from relay.batch.costs import judge
from relay.config import RelaySettings
from relay.errors import SinkTimeout, SinkUnavailable
from relay.events import Event
from relay.holds import KeyHolds
from relay.metrics import Metrics
from relay.sinks.base import Sink
from relay.sources.log.slot import TableLink

logger = logging.getLogger(__name__)


async def deliver_handed_over(
    store: TableLink, sink: Sink, settings: RelaySettings, backoff: Backoff, metrics: Metrics
) -> int:
    """Send the handed-over rows that may go now (a batch of them), and settle them in the table: how many
    were settled (sent, retried or dead-lettered), 0 when none may go or the sink did not answer."""
    rows = await store.handed_over(settings.batch_size)
    if not rows:
        return 0
    events = [
        Event(
            id=row[0], topic=row[1], key=row[2], payload=row[3].encode() if row[3] is not None else bytes(row[4]),
            headers=store.headers(row[6], row[7]), idempotency_key=row[7], attempts=row[8] + 1,
            created_at=row[9], content_type=row[5],
        )
        for row in rows
    ]  # fmt: skip
    # A key's run: its later events go only if the earlier ones are acknowledged or on their way in order
    # (relay.holds). Nothing is chained across calls: the next comes once this one is settled.
    seen: set[str] = set()
    for event in events:
        if event.key is not None:
            event.chained = event.key in seen
            seen.add(event.key)
    try:
        outcomes = await sink.publish(events, KeyHolds())
    except (SinkTimeout, SinkUnavailable) as exc:
        logger.warning("events handed over to the table not delivered: %s", exc, extra={"action": "sink_retry"})
        return 0
    verdict = judge(events, outcomes, settings, backoff, metrics)
    await store.settle_handed_over(
        verdict.sent, [(r.id, r.delay_seconds, r.error) for r in verdict.retry], [(d.id, d.error) for d in verdict.dead]
    )
    return len(verdict.sent) + len(verdict.retry) + len(verdict.dead)
