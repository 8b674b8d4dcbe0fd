"""What each answer of a sink costs: sorting a batch's outcomes, and the price of "not acknowledged".

The vocabulary is the sink port's (:mod:`relay.sinks.base`, its table): an
acknowledgement is sent; ``held`` and ``unavailable`` go back untried, no
attempt spent; ``timed_out`` (or a raised ``SinkTimeout``) goes back after
the timeouts' backoff, no attempt spent, and halves the next batches; a
refusal or failure spends an attempt (retry after a backoff by attempts, dead
at ``--max-attempts``); a raised ``SinkUnavailable`` gives the batch back at
once and stops the claims until the broker answers a check. Only a batch
*acknowledged in time* (at least one event acknowledged, none timed out)
grows the batches back and ends the timeouts' backoff. Each rule is decided
here, once: :func:`judge` sorts, :class:`Costs` charges.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from relay.backoff import Backoff, OutageBackoff
from relay.batching import BatchLimits
from relay.config import RelaySettings
from relay.events import Event, Outcome
from relay.metrics import Metrics, observe_many
from relay.store.base import Dead, Retry

logger = logging.getLogger(__name__)

#: A publish may overrun its bound (publish timeout plus the sink's grace) this much before it is reported.
PUBLISH_OVERRUN_TOLERANCE_SECONDS = 0.5


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
    # The events of one transaction share their creation time (now()): its latency is worked out once
    # (an equality test costs a twentieth of the subtraction).
    created: datetime | None = None
    latency = 0.0
    for event, outcome in zip(events, outcomes, strict=True):
        if outcome is None:
            sent.append(event.id)
            per_topic[event.topic] += 1
            if event.created_at != created:
                created = event.created_at
                latency = max(0.0, (now - created).total_seconds())
            latencies.append(latency)
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


class Costs:
    """A relay's account of what its batches' answers cost, across batches: the timeouts' backoff and
    the batch shrink, a broker found down, and when claims may resume. Both sources use it."""

    def __init__(
        self,
        settings: RelaySettings,
        metrics: Metrics,
        limits: BatchLimits,
        *,
        publish_grace_seconds: float = 0.0,
        timeouts: OutageBackoff | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        """``timeouts`` and ``backoff``: a relay's own, if it shares them with other rooms."""
        self.settings = settings
        self.metrics = metrics
        self.limits = limits
        self.backoff = backoff or Backoff(settings.backoff_initial_seconds, settings.backoff_max_seconds)
        self._publish_bound = settings.publish_timeout_seconds + publish_grace_seconds
        #: Publishes that timed out in a row: the loop backs off as for an outage.
        self.timeouts = timeouts or OutageBackoff()
        #: A publish raised ``SinkUnavailable``: no claims until the broker answers a check.
        self.sink_down = False
        #: No claim before this (monotonic): the timeouts' backoff.
        self.resume_claims_at = 0.0
        #: A settle put events back to retry: the gauges read the counts at their next turn.
        self.retried = False

    def verdict(self, events: Sequence[Event], outcomes: Sequence[Outcome]) -> Verdict:
        """The published batch's outcomes judged and charged: timed-out events go back after the
        timeouts' backoff (with the batch shrink); an acknowledgement in time ends the timeouts."""
        verdict = judge(events, outcomes, self.settings, self.backoff, self.metrics)
        if verdict.timed_out:
            delay = self.timed_out(len(verdict.timed_out), len(events))
            verdict.held.setdefault(delay, []).extend(verdict.timed_out)
        elif verdict.sent:
            # Only an acknowledgement says the broker answers in time: a batch all held,
            # unavailable or refused says nothing of it (see relay.sinks.base).
            self._acknowledged_in_time()
        return verdict

    def whole_batch_timed_out(self, events: Sequence[Event], error: Exception) -> Verdict:
        """The publish raised ``SinkTimeout``: every event goes back after the timeouts' backoff."""
        delay = self.timed_out(len(events), len(events), error)
        return Verdict([], [], [], {delay: [e.id for e in events]}, [])

    def broker_unavailable(self, events: Sequence[Event], error: Exception) -> Verdict:
        """The publish raised ``SinkUnavailable``: every event goes back at once, no attempt spent,
        and the claims wait for the broker to answer a check."""
        self.sink_down = True
        logger.warning(
            "broker unavailable, releasing %d events: %s",
            len(events),
            error,
            extra={"action": "release", "batch_size": len(events)},
        )
        return Verdict([], [], [], {0.0: [e.id for e in events]}, [])

    def broker_recovered(self) -> None:
        """The broker answered a check: claims go on."""
        self.sink_down = False

    def timed_out(self, timed_out: int, of: int, error: Exception | None = None) -> float:
        """Back off and shrink the batch as for an outage; the delay before the events are due again.

        The broker may have stored them: each repeat is a copy, so repeats
        slow down and shrink while timeouts repeat (bound: docs/delivery.md).
        """
        delay = self.timeouts.next_delay()
        self.limits.publish_timed_out()
        # Not attempts spent in the table (the broker may have them), but attempts it did not acknowledge:
        # the "Publishing fails" alert (docs/operations.md) must see a broker that times out.
        self.metrics.failed_attempts.inc(timed_out)
        self.resume_claims_at = max(self.resume_claims_at, time.monotonic() + delay)
        logger.warning(
            "no acknowledgement in time, releasing %d of %d events for %.1fs; next batches at most %d events%s",
            timed_out,
            of,
            delay,
            self.limits.count,
            f": {error}" if error else "",
            extra={"action": "release_timed_out", "batch_size": of},
        )
        return delay

    def _acknowledged_in_time(self) -> None:
        self.limits.published()
        if self.timeouts.failures and not self.limits.shrunk_by_timeouts:
            logger.info("the broker acknowledges full batches in time again", extra={"action": "timeouts_over"})
            self.timeouts.reset()

    def check_publish_time(self, seconds: float) -> None:
        """Say so when a publish ran past the bound the lease allows for it."""
        if seconds > self._publish_bound + PUBLISH_OVERRUN_TOLERANCE_SECONDS:
            # The start-up check counted on the bound: the lease may end before the settle.
            logger.warning(
                "a publish took %.1fs, longer than the %.1fs the lease allows for it",
                seconds,
                self._publish_bound,
                extra={"action": "publish_overrun"},
            )
