"""The relay loop: claim, publish, settle.

One loop and one stop event. The loop claims a batch (a short lease, no
transaction left open), hands it to a delivery task that publishes it and
settles the outcome, and claims again at once while batches come back full;
up to ``pipeline_depth`` batches are in flight so the database and the broker
work at the same time. When the outbox runs dry it waits for a NOTIFY, a
finished batch or the poll interval, whichever comes first: NOTIFY only
speeds things up, polling is the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from relay.backoff import Backoff, OutageBackoff, sleep_unless_stopped
from relay.config import RelaySettings
from relay.errors import SinkUnavailable, StoreUnavailable
from relay.events import Event, Outcome
from relay.metrics import Metrics, observe_many
from relay.sinks.base import Sink
from relay.store.base import Claim, Dead, Retry, Settlement, Store
from relay.tracing import batch_span

logger = logging.getLogger(__name__)

AGE_INTERVAL_SECONDS = 5.0
COUNTS_INTERVAL_SECONDS = 30.0
#: A publish may overrun its bound (publish timeout plus the sink's grace) this much before it is reported.
PUBLISH_OVERRUN_TOLERANCE_SECONDS = 0.5


class Relay:
    """Moves events from a store to a sink until stopped."""

    def __init__(
        self,
        store: Store,
        sink: Sink,
        settings: RelaySettings,
        *,
        metrics: Metrics | None = None,
        publish_grace_seconds: float = 0.0,
    ) -> None:
        """``publish_grace_seconds``: how long the sink may run past the publish timeout."""
        self.store = store
        self.sink = sink
        self.settings = settings
        self._publish_grace = publish_grace_seconds
        self._latest_publish_start = settings.latest_publish_start_seconds(publish_grace_seconds)
        self.metrics = metrics or Metrics()
        self._backoff = Backoff(settings.backoff_initial_seconds, settings.backoff_max_seconds)
        self._store_outage = OutageBackoff()
        self._sink_outage = OutageBackoff()
        self._sink_down = False
        self._wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._crash: BaseException | None = None
        self._next_reap = 0.0
        self._opened = False
        #: Last time the loop went round; /healthz reads it.
        self.heartbeat = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        """Relay until ``stop`` is set, then finish the batches in hand."""
        gauges = asyncio.create_task(self._refresh_gauges(stop), name="gauges")
        try:
            if not self._opened:
                await self._connect(stop)
            idle = self.settings.poll_interval_seconds
            while not stop.is_set():
                if self._crash is not None:
                    # A delivery task that died of a bug stops the relay loudly.
                    raise self._crash
                self.heartbeat = time.monotonic()
                if len(self._inflight) >= self.settings.pipeline_depth:
                    await self._wait_for_delivery()
                    continue
                if self._sink_down and not await self._sink_recovered(stop):
                    continue
                claimed = await self._claim(stop)
                if claimed is None:
                    continue
                if claimed == self.settings.batch_size:
                    idle = self.settings.poll_interval_seconds
                    continue
                if claimed:
                    idle = self.settings.poll_interval_seconds
                await self._idle(stop, idle)
                if not claimed:
                    idle = min(idle * 2, self.settings.poll_interval_max_seconds)
        finally:
            gauges.cancel()
            await asyncio.gather(gauges, return_exceptions=True)
            await self._drain()

    async def _refresh_gauges(self, stop: asyncio.Event) -> None:
        """Keep the table gauges fresh: the age often (an index probe), the counts less often (bounded reads)."""
        next_counts = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= next_counts:
                    next_counts = time.monotonic() + COUNTS_INTERVAL_SECONDS
                    self.metrics.observe_status(await self.store.gauges())
                else:
                    self.metrics.oldest_pending_age.set(await self.store.oldest_pending_age())
            except StoreUnavailable as exc:
                logger.info("gauges not refreshed: %s", exc, extra={"action": "gauges_retry"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), AGE_INTERVAL_SECONDS)

    async def open(self) -> None:
        """Connect the store and the sink; raise the store's or the sink's error if either cannot be used.

        ``run`` calls it (and rides out outages) unless it was called, and
        succeeded, before.
        """
        await self.store.open()
        await self.store.check()  # a standby answers, but cannot relay
        await self.sink.start()
        self._opened = True

    async def _connect(self, stop: asyncio.Event) -> None:
        # A relay never exits on a transient outage, not even at start-up.
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((StoreUnavailable, SinkUnavailable)),
            stop=lambda _: stop.is_set(),
            wait=Backoff.for_outages(),
            sleep=lambda seconds: sleep_unless_stopped(stop, seconds),
            before_sleep=_log_retry("waiting for servers: %s", "connect_retry"),
            reraise=True,
        )
        with contextlib.suppress(StoreUnavailable, SinkUnavailable):  # raised again only once stopped
            async for attempt in retrying:
                with attempt:
                    await self.open()

    async def _claim(self, stop: asyncio.Event) -> int | None:
        """Claim one batch and start delivering it; None when the database is away."""
        now = time.monotonic()
        try:
            if now >= self._next_reap:
                self._next_reap = now + self.settings.lease_seconds / 4
                reaped = await self.store.reap(max_attempts=self.settings.max_attempts)
                if reaped:
                    self.metrics.dead_lettered.inc(reaped)
                    logger.warning(
                        "dead-lettered %d events whose relays kept dying",
                        reaped,
                        extra={"action": "reap_dead"},
                    )
            # The lease runs from the claim statement's start on the server, so
            # measure from before sending it: a stall while the claim is in
            # flight must count against the lease.
            claimed_at = time.monotonic()
            started = time.perf_counter()
            claim = await self.store.claim(self.settings.batch_size, max_attempts=self.settings.max_attempts)
        except StoreUnavailable as exc:
            logger.warning("database unavailable: %s", exc, extra={"action": "store_retry"})
            await self._store_outage.sleep(stop)
            return None
        self._store_outage.reset()
        self.metrics.claims.inc()
        self.metrics.claim_duration.observe(time.perf_counter() - started)
        if not claim.events:
            self.metrics.empty_claims.inc()
            return 0
        if claim.reaped:
            self.metrics.reaped.inc(claim.reaped)
            logger.warning("took over %d expired leases", claim.reaped, extra={"action": "reap"})
        self.metrics.batch_size.observe(len(claim.events))
        task = asyncio.create_task(self._deliver(claim, claimed_at), name=f"deliver-{claim.token}")
        self._inflight.add(task)
        task.add_done_callback(self._delivered)
        return len(claim.events)

    def _delivered(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()
        self._wake.set()

    async def _wait_for_delivery(self) -> None:
        done, _ = await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()

    async def _idle(self, stop: asyncio.Event, timeout: float) -> None:
        self._wake.clear()
        waiters: list[asyncio.Task[Any]] = [
            asyncio.create_task(stop.wait()),
            asyncio.create_task(self._wake.wait()),
        ]
        if not self._sink_down:
            waiters.append(asyncio.create_task(self._notified(timeout, stop)))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _notified(self, timeout: float, stop: asyncio.Event) -> None:
        try:
            await self.store.wait(timeout)
        except StoreUnavailable as exc:
            logger.warning("lost the LISTEN connection: %s", exc, extra={"action": "listen_retry"})
            await self._store_outage.sleep(stop)

    async def _sink_recovered(self, stop: asyncio.Event) -> bool:
        try:
            await self.sink.check()
        except SinkUnavailable as exc:
            logger.warning("broker unavailable: %s", exc, extra={"action": "sink_retry"})
            await self._sink_outage.sleep(stop)
            return False
        logger.info("broker reachable again", extra={"action": "sink_recovered"})
        self._sink_down = False
        self._sink_outage.reset()
        return True

    async def _deliver(self, claim: Claim, claimed_at: float) -> None:
        # A batch that waited (a slow claim, a stalled process) until its lease
        # could end before the publish and the settle are done goes back instead:
        # publishing it now could race the relay that takes it over.
        if time.monotonic() - claimed_at > self._latest_publish_start:
            logger.warning(
                "lease nearly over before publishing, releasing %d events",
                len(claim.events),
                extra={"action": "release_stale", "batch_size": len(claim.events)},
            )
            await self._settle_until_lease_ends(claim, claimed_at, release={0.0: [e.id for e in claim.events]})
            return
        started = time.monotonic()
        try:
            with batch_span(claim.events, system=self.sink.name):
                outcomes = await self.sink.publish(claim.events)
        except SinkUnavailable as exc:
            self._sink_down = True
            logger.warning(
                "broker unavailable, releasing %d events: %s",
                len(claim.events),
                exc,
                extra={"action": "release", "batch_size": len(claim.events)},
            )
            await self._settle_until_lease_ends(claim, claimed_at, release={0.0: [e.id for e in claim.events]})
            return
        self._check_publish_time(time.monotonic() - started)
        sent, retry, dead, held = self._judge(claim.events, outcomes)
        settlement = await self._settle_until_lease_ends(
            claim, claimed_at, sent=sent, retry=retry, dead=dead, release=held
        )
        if settlement is not None and settlement.lost:
            self.metrics.lost_leases.inc(settlement.lost)
            logger.warning(
                "%d events of a batch were taken over by another relay before settling",
                settlement.lost,
                extra={"action": "lease_lost", "batch_size": len(claim.events)},
            )

    def _check_publish_time(self, seconds: float) -> None:
        bound = self.settings.publish_timeout_seconds + self._publish_grace
        if seconds > bound + PUBLISH_OVERRUN_TOLERANCE_SECONDS:
            # The start-up check counted on the bound: the lease may end before the settle.
            logger.warning(
                "a publish took %.1fs, longer than the %.1fs the lease allows for it",
                seconds,
                bound,
                extra={"action": "publish_overrun"},
            )

    def _judge(
        self, events: Sequence[Event], outcomes: Sequence[Outcome]
    ) -> tuple[list[int], list[Retry], list[Dead], dict[float, list[int]]]:
        """Sort a batch's outcomes into sent, retry, dead and held back (by delay)."""
        if len(outcomes) != len(events):
            raise RuntimeError(f"sink returned {len(outcomes)} outcomes for {len(events)} events")
        sent: list[int] = []
        retry: list[Retry] = []
        dead: list[Dead] = []
        # The broker of their route is down: not an attempt. They go back, due
        # when that broker is tried again, and keep their place in their key.
        held: dict[float, list[int]] = {}
        now = datetime.now(UTC)
        per_topic: Counter[str] = Counter()
        latencies: list[float] = []
        for event, outcome in zip(events, outcomes, strict=True):
            if outcome is None:
                sent.append(event.id)
                per_topic[event.topic] += 1
                latencies.append(max(0.0, (now - event.created_at).total_seconds()))
                continue
            if outcome.unavailable:
                delay = outcome.retry_after_seconds or self.settings.backoff_initial_seconds
                held.setdefault(delay, []).append(event.id)
                continue
            self.metrics.failed_attempts.inc()
            if outcome.permanent or event.attempts >= self.settings.max_attempts:
                reason = outcome.error if outcome.permanent else f"{outcome.error} (after {event.attempts} attempts)"
                dead.append(Dead(event.id, reason))
                self.metrics.dead_lettered.inc()
                logger.warning(
                    "dead-lettered event %d: %s",
                    event.id,
                    reason,
                    extra={"action": "dead_letter", "event_id": event.id, "topic": event.topic},
                )
            else:
                retry.append(Retry(event.id, self._backoff.delay(event.attempts), outcome.error))
                logger.info(
                    "event %d failed, will retry: %s",
                    event.id,
                    outcome.error,
                    extra={"action": "retry", "event_id": event.id, "attempts": event.attempts},
                )
        observe_many(self.metrics.publish_latency, latencies)
        for topic, count in per_topic.items():
            self.metrics.published.labels(topic).inc(count)
        if held:
            logger.debug(
                "holding back %d events whose sink is down",
                sum(map(len, held.values())),
                extra={"action": "hold_back", "batch_size": len(events)},
            )
        return sent, retry, dead, held

    async def _settle_until_lease_ends(
        self,
        claim: Claim,
        claimed_at: float,
        *,
        sent: Sequence[int] = (),
        retry: Sequence[Retry] = (),
        dead: Sequence[Dead] = (),
        release: Mapping[float, Sequence[int]] | None = None,
    ) -> Settlement | None:
        """Settle, then release (``{delay_seconds: ids}``); None when there was nothing to settle."""
        # The broker has the events; keep trying to record that while the lease
        # lasts (it runs from the claim). Past it another relay may re-claim
        # them: a duplicate, not a loss.
        lease_ends = claimed_at + self.settings.lease_seconds
        backoff = Backoff.for_outages()
        settlement: Settlement | None = None
        must_settle = bool(sent or retry or dead) or not release
        releases = [(delay, ids) for delay, ids in (release or {}).items() if ids]

        async def remaining_steps() -> None:
            # Each step runs once: a settle repeated after a later step failed
            # would find its rows gone and count them as lost leases.
            nonlocal settlement, must_settle
            if must_settle:
                settlement = await self.store.settle(claim, sent=sent, retry=retry, dead=dead)
                must_settle = False
            while releases:
                delay, ids = releases[0]
                await self.store.release(claim, ids, delay_seconds=delay)
                releases.pop(0)

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(StoreUnavailable),
            stop=lambda _: time.monotonic() >= lease_ends,
            # The last try comes as the lease ends, not a backoff after it.
            wait=lambda state: min(backoff(state), max(0.0, lease_ends - time.monotonic())),
            before_sleep=_log_retry("settle failed, retrying: %s", "settle_retry"),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await remaining_steps()
        except StoreUnavailable as exc:
            logger.error(
                "could not settle a batch before its lease ended: %s",
                exc,
                extra={"action": "settle_abandoned", "batch_size": len(claim.events)},
            )
            return None
        return settlement

    async def _drain(self) -> None:
        """Let the batches in hand finish publishing and settle (each is bounded)."""
        if self._inflight:
            logger.info("stopping: finishing %d batches in hand", len(self._inflight), extra={"action": "drain"})
            results = await asyncio.gather(*self._inflight, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    logger.error("a batch failed while stopping: %r", result, extra={"action": "drain_error"})
        with contextlib.suppress(Exception):
            await self.sink.close()
        with contextlib.suppress(Exception):
            await self.store.close()


def _log_retry(message: str, action: str) -> Callable[[RetryCallState], None]:
    """A tenacity ``before_sleep`` that logs the failure with ``message`` (one ``%s``) at WARNING."""

    def log(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        logger.warning(message, error, extra={"action": action})

    return log
