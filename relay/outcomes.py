"""Sorting a published batch's outcomes into what its settle records.

What each outcome means and costs is said once, on the sink port: :mod:`relay.sinks.base`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from relay.backoff import Backoff
from relay.config import RelaySettings
from relay.events import Event, Outcome
from relay.metrics import Metrics, observe_many
from relay.store.base import Dead, Retry

logger = logging.getLogger(__name__)


class Verdict(NamedTuple):
    """A batch's outcomes sorted: sent, retry, dead, held back (by delay), and timed out."""

    sent: list[int]
    retry: list[Retry]
    dead: list[Dead]
    held: dict[float, list[int]]
    timed_out: list[int]


def judge(
    events: Sequence[Event], outcomes: Sequence[Outcome], settings: RelaySettings, backoff: Backoff, metrics: Metrics
) -> Verdict:
    """Sort a batch's outcomes into sent, retry, dead, held back (by delay) and timed out."""
    if len(outcomes) != len(events):
        raise RuntimeError(f"sink returned {len(outcomes)} outcomes for {len(events)} events")
    sent: list[int] = []
    retry: list[Retry] = []
    dead: list[Dead] = []
    # The broker of their route is down: not an attempt. They go back, due
    # when that broker is tried again, and keep their place in their key.
    held: dict[float, list[int]] = {}
    # No acknowledgement in time: not an attempt either (the broker may have them).
    timed_out: list[int] = []
    now = datetime.now(UTC)
    per_topic: Counter[str] = Counter()
    latencies: list[float] = []
    for event, outcome in zip(events, outcomes, strict=True):
        if outcome is None:
            sent.append(event.id)
            per_topic[event.topic] += 1
            latencies.append(max(0.0, (now - event.created_at).total_seconds()))
            continue
        if outcome.timed_out:
            timed_out.append(event.id)
            continue
        if outcome.held:
            # Not tried: an earlier event of its key failed and blocks the key.
            held.setdefault(0.0, []).append(event.id)
            continue
        if outcome.unavailable:
            delay = outcome.retry_after_seconds or settings.backoff_initial_seconds
            held.setdefault(delay, []).append(event.id)
            continue
        metrics.failed_attempts.inc()
        if outcome.permanent or event.attempts >= settings.max_attempts:
            reason = outcome.error if outcome.permanent else f"{outcome.error} (after {event.attempts} attempts)"
            dead.append(Dead(event.id, reason))
            metrics.dead_lettered.inc()
            logger.warning(
                "dead-lettered event %d: %s",
                event.id,
                reason,
                extra={"action": "dead_letter", "event_id": event.id, "topic": event.topic},
            )
        else:
            retry.append(Retry(event.id, backoff.delay(event.attempts), outcome.error))
            logger.info(
                "event %d failed, will retry: %s",
                event.id,
                outcome.error,
                extra={"action": "retry", "event_id": event.id, "attempts": event.attempts},
            )
    metrics.sent_events += len(sent)
    observe_many(metrics.publish_latency, latencies)
    for topic, count in per_topic.items():
        metrics.published.labels(topic).inc(count)
    if held:
        logger.debug(
            "holding back %d events whose sink is down",
            sum(map(len, held.values())),
            extra={"action": "hold_back", "batch_size": len(events)},
        )
    return Verdict(sent, retry, dead, held, timed_out)
