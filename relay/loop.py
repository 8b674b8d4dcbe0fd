"""The relay loop: claim, hand each batch to its delivery, idle, ride out outages, drain.

One loop and one stop event. The loop takes a batch from its source (the
table: a short lease, no transaction left open), hands it to a delivery task
that lives it (:mod:`relay.batch`: publish, judge, settle), and claims again
at once while batches come back full;
up to ``pipeline_depth`` batches are in flight so the database and the broker
work at the same time. When the outbox runs dry it waits for a NOTIFY, a
finished batch or the poll interval, whichever comes first: NOTIFY only
speeds things up, polling is the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from tenacity import AsyncRetrying, retry_if_exception_type

from relay.backoff import Backoff, OutageBackoff, log_before_sleep, sleep_unless_stopped
from relay.batch import Costs, Deliveries
from relay.batching import BatchLimits
from relay.config import RelaySettings
from relay.errors import ClaimTimeout, SinkUnavailable, StoreUnavailable
from relay.events import Event
from relay.metrics import Metrics
from relay.progress import refresh_gauges
from relay.sinks.base import Sink
from relay.sources.port import Source, Started
from relay.sources.table import TableSource
from relay.store.base import Store

logger = logging.getLogger(__name__)

#: While the loop waits for batches in hand, it beats this often.
BEAT_SECONDS = 1.0
#: The longest a store or sink call may take before the loop counts as wedged. Each call
#: is bounded by its adapter: PostgreSQL's by the statement timeout plus a margin (35 s),
#: a connect by its timeout (10 s). A batch's publish and settles end within its lease,
#: so a batch still in hand this long after its lease ended is wedged too.
CALL_ALLOWANCE_SECONDS = 60.0


def _capped_bytes(event: Event) -> int:
    """About what the byte cap counts of ``event``: its payload, and its headers' names and values."""
    if not event.headers:
        return len(event.payload)
    return len(event.payload) + sum(len(name) + len(value) for name, value in event.headers.items())


@dataclass(slots=True)
class _Ahead:
    """A claim started while the last one's events were built: when it was sent, what it asked
    for, and when the database answered it."""

    sent_at: float
    count: int
    max_bytes: int
    task: asyncio.Task[Started] = field(init=False)
    answered_at: float | None = None

    async def answer(self, claiming: Awaitable[Started]) -> Started:
        try:
            return await claiming
        finally:
            self.answered_at = time.monotonic()


class Relay:
    """Moves events from a source to a sink until stopped."""

    def __init__(
        self,
        store: Store | None,
        sink: Sink,
        settings: RelaySettings,
        *,
        metrics: Metrics | None = None,
        publish_grace_seconds: float = 0.0,
        source: Source | None = None,
    ) -> None:
        """``publish_grace_seconds``: how long the sink may run past the publish timeout. ``source``:
        where batches come from, by default the table ``store`` holds (``store`` keeps the gauges
        and the reaper). Without a ``store`` (the log source) nothing is leased: no reaper, no gauges
        of the table."""
        self.store = store
        self.sink = sink
        self.settings = settings
        self.metrics = metrics or Metrics()
        if source is None:
            if store is None:
                raise ValueError("a relay needs a source, or the store of its table")
            source = TableSource(store, max_attempts=settings.max_attempts)
        self.source: Source = source
        self._store_outage = OutageBackoff()
        self._sink_outage = OutageBackoff()
        #: The next claim's count and byte cap: shrunk while claims or publishes time out (relay/batching.py).
        self.limits = BatchLimits(settings.batch_size, settings.batch_bytes)
        #: What the sink's answers cost across batches (timeouts, a broker down): relay/batch/costs.py.
        self.costs = Costs(settings, self.metrics, self.limits, publish_grace_seconds=publish_grace_seconds)
        #: The batches in hand, their turns and the keys on hold: relay/batch/life.py.
        self.deliveries = Deliveries(
            self.source, sink, settings, self.metrics, self.costs, publish_grace_seconds=publish_grace_seconds,
            recurring=isinstance(source, TableSource),  # only the table's claim goes on with recurring keys
        )  # fmt: skip
        #: Keys whose chain of events in flight broke (relay/holds.py); the deliveries own them.
        self.holds = self.deliveries.holds
        self._wake = asyncio.Event()
        # Delivery tasks and when their batches were claimed.
        self._inflight: dict[asyncio.Task[None], float] = {}
        self._crash: BaseException | None = None
        # A source without leases has none to reap: the reaper is never due.
        self._next_reap = 0.0 if store is not None else math.inf
        self._opened = False
        #: Last time the loop went round, or found the batches it waits for in time.
        self.heartbeat = time.monotonic()
        # The end of a wait on purpose (a backoff, a bounded call) the loop is in.
        self._away_until = 0.0
        # The claim started while the last one's events were built.
        self._ahead: _Ahead | None = None

    def alive(self) -> bool:
        """True unless the loop is wedged: it went round within a lease, or waits on purpose.

        On purpose: through a backoff, a store or sink call, or for batches in
        hand that are still within their time. ``/healthz`` answers with this.
        """
        now = time.monotonic()
        return now - self.heartbeat < self.settings.lease_seconds or now < self._away_until

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
                if self._ahead is not None and (self.costs.sink_down or self.costs.timeouts.failures):
                    # Claimed before the broker went away or timed out: it goes back, so that the
                    # copies a stalled broker gets stay bounded by the shrunk batches (docs/delivery.md).
                    await self._give_back_ahead()
                if len(self._inflight) >= self._pipeline_depth():
                    await self._wait_for_delivery()
                    continue
                if self.costs.sink_down and not await self._sink_recovered(stop):
                    continue
                if (backing_off := self.costs.resume_claims_at - time.monotonic()) > 0:
                    await self._sleep(stop, backing_off)
                    continue
                # A batch that ends from here on (while the claim's answer is on its way) frees its keys'
                # next events after the claim's snapshot: it wakes the idle below, however soon it ends.
                self._wake.clear()
                claimed = await self._claim(stop)
                if claimed is None:
                    continue
                count, full = claimed
                if count:
                    idle = self.settings.poll_interval_seconds
                if full:
                    continue
                await self._idle(stop, idle)
                if not count:
                    idle = min(idle * 2, self.settings.poll_interval_max_seconds)
        finally:
            gauges.cancel()
            await asyncio.gather(gauges, return_exceptions=True)
            await self._give_back_ahead()
            await self._drain()

    async def _refresh_gauges(self, stop: asyncio.Event) -> None:
        if self.store is not None:  # the table's counts; a log source keeps its slot's gauges itself
            await refresh_gauges(self.store, self.metrics, self.costs, stop)

    async def open(self) -> None:
        """Connect the source and the sink; raise the source's or the sink's error if either cannot be used.

        ``run`` calls it (and rides out outages) unless it was called, and
        succeeded, before. Each call is bounded, so a start-up try is a wait on
        purpose: alive throughout, however long the lease.
        """
        self._away(CALL_ALLOWANCE_SECONDS)
        await self.source.open()
        self._away(CALL_ALLOWANCE_SECONDS)
        await self.source.check()  # a standby answers, but cannot relay
        self._away(CALL_ALLOWANCE_SECONDS)
        await self.sink.start()
        self._opened = True

    async def _connect(self, stop: asyncio.Event) -> None:
        # A relay never exits on a transient outage, not even at start-up.
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((StoreUnavailable, SinkUnavailable)),
            stop=lambda _: stop.is_set(),
            wait=Backoff.for_outages(),
            # The waits between tries are on purpose: /healthz stays 200 through a long start-up.
            sleep=lambda seconds: self._sleep(stop, seconds),
            before_sleep=log_before_sleep(logger, "waiting for servers: %s", "connect_retry"),
            reraise=True,
        )
        with contextlib.suppress(StoreUnavailable, SinkUnavailable):  # raised again only once stopped
            async for attempt in retrying:
                with attempt:
                    await self.open()

    def _pipeline_depth(self) -> int:
        # While publishes time out, one batch at a time: each is a copy if the broker stored it.
        return 1 if self.costs.timeouts.failures else self.settings.pipeline_depth

    async def _claim(self, stop: asyncio.Event) -> tuple[int, bool] | None:
        """Claim one batch and start delivering it: how many events, and whether more may be waiting.

        None when the database is away or the claim timed out.
        """
        count, max_bytes = self.limits.count, self.limits.max_bytes
        # The lease runs from the claim statement's start on the server, so
        # measure from before sending it: a stall while the claim is in
        # flight must count against the lease.
        claimed_at = time.monotonic()
        self._away(CALL_ALLOWANCE_SECONDS)
        started: Started | None = None
        # When the database answered: a claim started ahead may have waited since, and its time
        # (the metric, the batch limits) is the database's and the decoding's, not the wait.
        answered_at: float | None = None
        try:
            if (ahead := self._ahead) is not None:
                self._ahead = None
                claimed_at, count, max_bytes = ahead.sent_at, ahead.count, ahead.max_bytes
                try:
                    started = await ahead.task
                finally:
                    answered_at = ahead.answered_at
            else:
                await self._reap_now_and_then(claimed_at)
                claimed_at = time.monotonic()
                chain = self.deliveries.chain(claimed_at)
                started = await self.source.take(count, max_bytes=max_bytes, chain=chain)
            answered_at = answered_at or time.monotonic()
            if started.rows >= count and self._may_claim_ahead(stop):
                await self._claim_ahead(started)
            building = time.monotonic()
            claim = await started.events()
            answered_at += time.monotonic() - building  # and the time the events took to build
        except ClaimTimeout as exc:
            smallest = self.limits.smallest
            self.limits.claim_timed_out((answered_at or time.monotonic()) - claimed_at)
            logger.warning(
                "claim timed out, next claims take at most %d events and %d bytes: %s",
                self.limits.count,
                self.limits.max_bytes,
                exc,
                extra={"action": "claim_shrink", "batch_size": self.limits.count},
            )
            if smallest:  # nothing left to shrink: the database itself is slow
                await self._sleep(stop, self._store_outage.next_delay())
            return None
        except StoreUnavailable as exc:
            if started is not None:
                # Leased, but its events could not be built: a claim started ahead may go on from its
                # keys, and must not send their next events while these wait out their lease.
                self.deliveries.hold(started.tails().events)
            logger.warning("database unavailable: %s", exc, extra={"action": "store_retry"})
            await self._sleep(stop, self._store_outage.next_delay())
            return None
        took = answered_at - claimed_at
        self.limits.claimed(took)
        self._store_outage.reset()
        self.metrics.claims.inc()
        self.metrics.claim_duration.observe(took)
        if claim.buried:
            self.metrics.dead_lettered.inc(claim.buried)
        if not claim.events:
            self.metrics.empty_claims.inc()
            # A claim that dead-lettered all it found (bad rows, MySQL) says nothing of what is left.
            return 0, claim.buried > 0
        if claim.reaped:
            self.metrics.reaped.inc(claim.reaped)
            logger.warning("took over %d expired leases", claim.reaped, extra={"action": "reap"})
        self.metrics.batch_size.observe(len(claim.events))
        payload_bytes = sum(map(_capped_bytes, claim.events))
        self.limits.took(len(claim.events), payload_bytes)
        batch = self.deliveries.take(claim, claimed_at)
        task = asyncio.create_task(self.deliveries.deliver(batch), name=f"deliver-{claim.token}")
        self._inflight[task] = claimed_at
        task.add_done_callback(self._delivered)
        # Also for a task cancelled before it ran: its ``finally`` never does, and the next batch waits.
        task.add_done_callback(lambda _: self.deliveries.end(batch))
        full = len(claim.events) >= count or payload_bytes >= max_bytes
        return len(claim.events), full

    def _may_claim_ahead(self, stop: asyncio.Event) -> bool:
        """Whether to start the next claim before this one's events are built: while claims come back
        full and nothing else (stopping, a backoff, a broker down, timeouts, the reaper) is due."""
        now = time.monotonic()
        return not (
            stop.is_set()
            or self.costs.sink_down
            or self.costs.timeouts.failures
            or self._crash is not None
            or now < self.costs.resume_claims_at
            or now >= self._next_reap
        )

    async def _claim_ahead(self, started: Started) -> None:
        """Start the next claim, going on from ``started``'s keys, and let it reach the database before
        ``started``'s events are built: the database works on it meanwhile."""
        ahead = _Ahead(time.monotonic(), self.limits.count, self.limits.max_bytes)
        chain = self.deliveries.chain(ahead.sent_at, more=[started.tails()])
        claiming = self.source.take(ahead.count, max_bytes=ahead.max_bytes, chain=chain)
        ahead.task = asyncio.create_task(ahead.answer(claiming), name="claim-ahead")
        self._ahead = ahead
        await asyncio.sleep(0)  # the task sends its statement, then waits for the answer

    async def _give_back_ahead(self) -> None:
        """The claim started ahead, if any, goes back unpublished (cancelled, on the way out of a crash)."""
        if self._ahead is None:
            return
        task, self._ahead = self._ahead.task, None
        if not task.done() and self._crash is not None:
            task.cancel()
        try:
            await self.deliveries.give_back(await (await task).events())
        except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - on the way out, whatever stopped the loop
            # Its leases end on their own; the attempt counts, as for a relay that died.
            logger.info("a claim started ahead was not given back: %r", exc, extra={"action": "claim_ahead_lost"})

    async def _reap_now_and_then(self, now: float) -> None:
        if now < self._next_reap or self.store is None:
            return
        self._next_reap = now + self.settings.lease_seconds / 4
        reaped = await self.store.reap(max_attempts=self.settings.max_attempts)
        if reaped:
            self.metrics.dead_lettered.inc(reaped)
            logger.warning("dead-lettered %d events whose relays kept dying", reaped, extra={"action": "reap_dead"})

    def _delivered(self, task: asyncio.Task[None]) -> None:
        self._inflight.pop(task, None)
        if not task.cancelled() and task.exception() is not None and self._crash is None:
            self._crash = task.exception()
        self._wake.set()

    async def _wait_for_delivery(self) -> None:
        for task in await self._batches_done(asyncio.FIRST_COMPLETED):
            task.result()

    async def _batches_done(self, return_when: str) -> set[asyncio.Task[None]]:
        """Wait for the batches in hand (the first, or all of them), beating while they are within their time.

        A full pipeline during a long database outage waits for settles that
        retry until the lease ends: the loop is alive, not wedged.
        """
        waiting, finished = set(self._inflight), set()
        while waiting:
            done, waiting = await asyncio.wait(waiting, timeout=BEAT_SECONDS, return_when=return_when)
            finished |= done
            if finished and return_when == asyncio.FIRST_COMPLETED:
                break
            now = time.monotonic()
            oldest = min((self._inflight.get(task, now) for task in waiting), default=now)
            if now - oldest < self.settings.lease_seconds + CALL_ALLOWANCE_SECONDS:
                self.heartbeat = now
        return finished

    async def _sleep(self, stop: asyncio.Event, seconds: float) -> None:
        """Back off for ``seconds`` (less if stopped meanwhile): a wait on purpose, so alive throughout."""
        self._away(seconds)
        await sleep_unless_stopped(stop, seconds)

    def _away(self, seconds: float) -> None:
        """The loop waits on purpose for up to ``seconds``: alive meanwhile, whatever the lease."""
        self._away_until = max(self._away_until, time.monotonic() + seconds)

    async def _idle(self, stop: asyncio.Event, timeout: float) -> None:
        """Wait for a batch to end (since the claim before: ``run`` clears the wake before it), a NOTIFY,
        ``stop`` or ``timeout``."""
        waiters: list[asyncio.Task[Any]] = [
            asyncio.create_task(stop.wait()),
            asyncio.create_task(self._wake.wait()),
        ]
        if not self.costs.sink_down:
            waiters.append(asyncio.create_task(self._notified(timeout, stop)))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _notified(self, timeout: float, stop: asyncio.Event) -> None:
        try:
            await self.source.wait(timeout)
        except StoreUnavailable as exc:
            logger.warning("lost the LISTEN connection: %s", exc, extra={"action": "listen_retry"})
            await self._sleep(stop, self._store_outage.next_delay())

    async def _sink_recovered(self, stop: asyncio.Event) -> bool:
        self._away(CALL_ALLOWANCE_SECONDS)
        try:
            await self.sink.check()
        except SinkUnavailable as exc:
            logger.warning("broker unavailable: %s", exc, extra={"action": "sink_retry"})
            await self._sleep(stop, self._sink_outage.next_delay())
            return False
        logger.info("broker reachable again", extra={"action": "sink_recovered"})
        self.costs.broker_recovered()
        self._sink_outage.reset()
        return True

    async def _drain(self) -> None:
        """Let the batches in hand finish publishing and settle (each is bounded)."""
        if self._inflight:
            logger.info("stopping: finishing %d batches in hand", len(self._inflight), extra={"action": "drain"})
            for task in await self._batches_done(asyncio.ALL_COMPLETED):
                if not task.cancelled() and task.exception() is not None:
                    logger.error("a batch failed while stopping: %r", task.exception(), extra={"action": "drain_error"})
        # The source first: its last confirm (and the log source's sweep of parked events) may still
        # need the sink; nothing is published after it.
        with contextlib.suppress(Exception):
            await self.source.close()
        with contextlib.suppress(Exception):
            await self.sink.close()
