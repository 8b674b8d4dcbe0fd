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
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

from tenacity import AsyncRetrying, retry_if_exception_type

from relay.backoff import Backoff, OutageBackoff, log_before_sleep, sleep_unless_stopped
from relay.batching import BatchLimits
from relay.config import RelaySettings
from relay.errors import ClaimTimeout, SinkTimeout, SinkUnavailable, StoreUnavailable
from relay.events import Event, Outcome
from relay.holds import KeyHolds, mark_chained
from relay.metrics import Metrics
from relay.outcomes import Verdict, judge
from relay.progress import Progress
from relay.settling import renewed, settle_within_lease
from relay.sinks.base import Sink
from relay.store.base import Claim, Started, Store
from relay.tracing import batch_span

logger = logging.getLogger(__name__)

AGE_INTERVAL_SECONDS = 5.0
COUNTS_INTERVAL_SECONDS = 30.0
#: A publish may overrun its bound (publish timeout plus the sink's grace) this much before it is reported.
PUBLISH_OVERRUN_TOLERANCE_SECONDS = 0.5
#: While the loop waits for batches in hand, it beats this often.
BEAT_SECONDS = 1.0
#: The longest a store or sink call may take before the loop counts as wedged. Each call
#: is bounded by its adapter: PostgreSQL's by the statement timeout plus a margin (35 s),
#: a connect by its timeout (10 s). A batch's publish and settles end within its lease,
#: so a batch still in hand this long after its lease ended is wedged too.
CALL_ALLOWANCE_SECONDS = 60.0
#: How many batches done with whose keys count as recent: a key that comes back within them recurs.
RECENT_BATCHES = 2


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
        # Shrunk while claims or publishes time out; see relay/batching.py.
        self._limits = BatchLimits(settings.batch_size, settings.batch_bytes)
        # Publishes that timed out in a row: the loop backs off as for an outage.
        self._timeouts = OutageBackoff()
        self._resume_claims_at = 0.0
        self._wake = asyncio.Event()
        # Delivery tasks and when their batches were claimed.
        self._inflight: dict[asyncio.Task[None], float] = {}
        # The batches in hand and when they were claimed: on a sink that keeps a
        # key's order across batches, a claim may go on with the keys they hold.
        self._flying: dict[UUID, tuple[Claim, float]] = {}
        # The keys of the last batches done with: a key of a batch in hand that was in one of them too
        # is a busy one, and a claim goes on with it even with one event in hand (see _chain).
        self._recent_keys: deque[frozenset[str]] = deque(maxlen=RECENT_BATCHES)
        #: Keys whose chain of events in flight broke (relay/holds.py).
        self.holds = KeyHolds()
        self._crash: BaseException | None = None
        self._next_reap = 0.0
        self._opened = False
        #: Last time the loop went round, or found the batches it waits for in time.
        self.heartbeat = time.monotonic()
        # The end of a wait on purpose (a backoff, a bounded call) the loop is in.
        self._away_until = 0.0
        # The claim started while the last one's events were built.
        self._ahead: _Ahead | None = None
        # Set once the batch handed out last started publishing or was given back: the next batch
        # may go on with its keys, so it waits for that before publishing (see ``_deliver``).
        self._last_turn: asyncio.Event | None = None
        # Set when a settle put events back to retry: the gauges task reads the counts at its next turn.
        self._retried = False

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
                if self._ahead is not None and (self._sink_down or self._timeouts.failures):
                    # Claimed before the broker went away or timed out: it goes back, so that the
                    # copies a stalled broker gets stay bounded by the shrunk batches (docs/delivery.md).
                    await self._give_back_ahead()
                if len(self._inflight) >= self._pipeline_depth():
                    await self._wait_for_delivery()
                    continue
                if self._sink_down and not await self._sink_recovered(stop):
                    continue
                if (backing_off := self._resume_claims_at - time.monotonic()) > 0:
                    await self._sleep(stop, backing_off)
                    continue
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
        """Keep the table gauges fresh: the age often (an index probe), the counts less often (bounded reads),
        and sooner after this relay put an event back to retry (a misroute shows in seconds); log progress."""
        next_counts = 0.0
        progress = Progress(self.metrics.sent_events, time.monotonic())
        while not stop.is_set():
            try:
                if time.monotonic() >= next_counts or self._retried:
                    self._retried = False
                    next_counts = max(next_counts, time.monotonic() + COUNTS_INTERVAL_SECONDS)
                    status = await self.store.gauges()
                    self.metrics.observe_status(status)
                    progress.observe(status, sent=self.metrics.sent_events, now=time.monotonic())
                else:
                    self.metrics.oldest_pending_age.set(await self.store.oldest_pending_age())
            except StoreUnavailable as exc:
                logger.info("gauges not refreshed: %s", exc, extra={"action": "gauges_retry"})
            except Exception as exc:  # noqa: BLE001 - gauges that stop for good would hide every backlog
                # Any other failure (a row no query expected) is said, and the next round tries again:
                # the alerts on these gauges must not go quiet while the relay goes on.
                logger.warning(
                    "gauges not refreshed (%s): %s", type(exc).__name__, exc, extra={"action": "gauges_failed"}
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), AGE_INTERVAL_SECONDS)

    async def open(self) -> None:
        """Connect the store and the sink; raise the store's or the sink's error if either cannot be used.

        ``run`` calls it (and rides out outages) unless it was called, and
        succeeded, before. Each call is bounded, so a start-up try is a wait on
        purpose: alive throughout, however long the lease.
        """
        self._away(CALL_ALLOWANCE_SECONDS)
        await self.store.open()
        self._away(CALL_ALLOWANCE_SECONDS)
        await self.store.check()  # a standby answers, but cannot relay
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
        return 1 if self._timeouts.failures else self.settings.pipeline_depth

    async def _claim(self, stop: asyncio.Event) -> tuple[int, bool] | None:
        """Claim one batch and start delivering it: how many events, and whether more may be waiting.

        None when the database is away or the claim timed out.
        """
        count, max_bytes = self._limits.count, self._limits.max_bytes
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
                started = await self.store.start_claim(
                    count, max_attempts=self.settings.max_attempts, max_bytes=max_bytes, chain=self._chain(claimed_at)
                )
            answered_at = answered_at or time.monotonic()
            if started.rows >= count and self._may_claim_ahead(stop):
                await self._claim_ahead(started)
            building = time.monotonic()
            claim = await started.events()
            answered_at += time.monotonic() - building  # and the time the events took to build
        except ClaimTimeout as exc:
            smallest = self._limits.smallest
            self._limits.claim_timed_out((answered_at or time.monotonic()) - claimed_at)
            logger.warning(
                "claim timed out, next claims take at most %d events and %d bytes: %s",
                self._limits.count,
                self._limits.max_bytes,
                exc,
                extra={"action": "claim_shrink", "batch_size": self._limits.count},
            )
            if smallest:  # nothing left to shrink: the database itself is slow
                await self._sleep(stop, self._store_outage.next_delay())
            return None
        except StoreUnavailable as exc:
            if started is not None:
                # Leased, but its events could not be built: a claim started ahead may go on from its
                # keys, and must not send their next events while these wait out their lease.
                self.holds.hold(started.tails().events)
            logger.warning("database unavailable: %s", exc, extra={"action": "store_retry"})
            await self._sleep(stop, self._store_outage.next_delay())
            return None
        took = answered_at - claimed_at
        self._limits.claimed(took)
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
        self._limits.took(len(claim.events), payload_bytes)
        mark_chained(claim.events, [other.events for other, _ in self._flying.values()])
        self._flying[claim.token] = (claim, claimed_at)
        before, turn = self._last_turn, asyncio.Event()
        self._last_turn = turn
        task = asyncio.create_task(self._deliver(claim, claimed_at, before, turn), name=f"deliver-{claim.token}")
        self._inflight[task] = claimed_at
        task.add_done_callback(self._delivered)
        # Also for a task cancelled before it ran: its ``finally`` never does, and the next batch waits.
        task.add_done_callback(lambda _: self._end_turn(claim, turn))
        full = len(claim.events) >= count or payload_bytes >= max_bytes
        return len(claim.events), full

    def _chain(self, now: float, *, more: Sequence[Claim] = ()) -> list[Claim]:
        """The batches in hand a claim may go on from: those that may still be published, and ``more``,
        without the events of keys on hold (their next runs would only come back held). None on a sink
        that does not keep a key's order across batches."""
        if not self.sink.chains_keys:
            return []
        chain = [claim for claim, at in self._flying.values() if now - at < self._latest_publish_start]
        chain.extend(more)
        held = self.holds.snapshot()
        if held:
            chain = [replace(claim, events=[e for e in claim.events if e.key not in held]) for claim in chain]
        if self._recent_keys:
            recent = frozenset().union(*self._recent_keys)
            chain = [
                replace(claim, recurring=frozenset(e.key for e in claim.events if e.key in recent)) for claim in chain
            ]
        return chain

    def _may_claim_ahead(self, stop: asyncio.Event) -> bool:
        """Whether to start the next claim before this one's events are built: while claims come back
        full and nothing else (stopping, a backoff, a broker down, timeouts, the reaper) is due."""
        now = time.monotonic()
        return not (
            stop.is_set()
            or self._sink_down
            or self._timeouts.failures
            or self._crash is not None
            or now < self._resume_claims_at
            or now >= self._next_reap
        )

    async def _claim_ahead(self, started: Started) -> None:
        """Start the next claim, going on from ``started``'s keys, and let it reach the database before
        ``started``'s events are built: the database works on it meanwhile."""
        ahead = _Ahead(time.monotonic(), self._limits.count, self._limits.max_bytes)
        claiming = self.store.start_claim(
            ahead.count,
            max_attempts=self.settings.max_attempts,
            max_bytes=ahead.max_bytes,
            chain=self._chain(ahead.sent_at, more=[started.tails()]),
        )
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
            claim = await (await task).events()
            self.holds.hold(claim.events)
            await self.store.release(claim, [e.id for e in claim.events])
        except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - on the way out, whatever stopped the loop
            # Its leases end on their own; the attempt counts, as for a relay that died.
            logger.info("a claim started ahead was not given back: %r", exc, extra={"action": "claim_ahead_lost"})

    async def _reap_now_and_then(self, now: float) -> None:
        if now < self._next_reap:
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
        self._sink_down = False
        self._sink_outage.reset()
        return True

    async def _deliver(
        self, claim: Claim, claimed_at: float, before: asyncio.Event | None, turn: asyncio.Event
    ) -> None:
        """Publish and settle ``claim`` once the batch handed out before it has had its turn.

        On a sink that keeps a key's order across batches, this batch may hold the next events of
        the keys of the one before it, and the sink keeps their order only if it is handed that
        batch first. Batches usually start in the order they were claimed, but one that must renew
        its lease first (a slow claim, a stalled process) waits for the database meanwhile: the
        batch after it must not overtake it. ``turn`` is set once this batch started publishing or
        was given back (its keys held), and the next batch waits for it.
        """
        try:
            if before is not None and self.sink.chains_keys:
                await before.wait()
            await self._publish_and_settle(claim, claimed_at, turn)
        finally:
            self._end_turn(claim, turn)

    def _end_turn(self, claim: Claim, turn: asyncio.Event) -> None:
        """``claim`` is done with: a batch that ended before it reached the sink (an error, a
        cancellation) holds its keys first, so that the next batch does not send their later events."""
        if not turn.is_set():
            self.holds.hold(claim.events)
            turn.set()
        if self._flying.pop(claim.token, None) is not None and self.sink.chains_keys:
            self._recent_keys.append(frozenset(e.key for e in claim.events if e.key is not None))

    async def _publish_and_settle(self, claim: Claim, claimed_at: float, turn: asyncio.Event) -> None:
        # A batch that waited (a slow claim, a stalled process) until its lease
        # could end before the publish and the settle are done renews the lease
        # of what it still holds, or goes back: publishing on the old lease
        # could race the relay that takes it over.
        if time.monotonic() - claimed_at > self._latest_publish_start:
            renewing = time.monotonic()
            if (fresh := await renewed(self.store, claim, self.holds)) is not None:
                claim, claimed_at = fresh, renewing
                self._flying[claim.token] = (claim, claimed_at)
        lease_ends = claimed_at + self.settings.lease_seconds
        everything = [e.id for e in claim.events]
        if time.monotonic() - claimed_at > self._latest_publish_start:
            logger.warning(
                "lease nearly over before publishing, releasing %d events",
                len(claim.events),
                extra={"action": "release_stale", "batch_size": len(claim.events)},
            )
            self.holds.hold(claim.events)
            turn.set()
            await settle_within_lease(self.store, claim, lease_ends, release={0.0: everything})
            return
        started = time.monotonic()
        # The next batch goes once this one is handed to the sink: it runs up to its first wait first.
        turn.set()
        try:
            with batch_span(claim.events, system=self.sink.name):
                outcomes = await self.sink.publish(claim.events, self.holds)
        except SinkTimeout as exc:
            self.holds.hold(claim.events)
            delay = self._publish_timed_out(len(claim.events), len(claim.events), exc)
            await settle_within_lease(self.store, claim, lease_ends, release={delay: everything})
            return
        except SinkUnavailable as exc:
            self.holds.hold(claim.events)
            self._sink_down = True
            logger.warning(
                "broker unavailable, releasing %d events: %s",
                len(claim.events),
                exc,
                extra={"action": "release", "batch_size": len(claim.events)},
            )
            await settle_within_lease(self.store, claim, lease_ends, release={0.0: everything})
            return
        self._check_publish_time(time.monotonic() - started)
        # The sink held these keys already; a sink that forgot must not break their order.
        self.holds.hold([e for e, outcome in zip(claim.events, outcomes, strict=False) if outcome is not None])
        verdict = self._judge(claim.events, outcomes)
        if verdict.timed_out:
            delay = self._publish_timed_out(len(verdict.timed_out), len(claim.events))
            verdict.held.setdefault(delay, []).extend(verdict.timed_out)
        elif verdict.sent:
            # Only an acknowledgement says the broker answers in time: a batch all held,
            # unavailable or refused says nothing of it (see relay.sinks.base).
            self._publish_acknowledged()
        settlement = await settle_within_lease(
            self.store,
            claim,
            lease_ends,
            sent=verdict.sent,
            retry=verdict.retry,
            dead=verdict.dead,
            release=verdict.held,
        )
        self._retried = self._retried or bool(verdict.retry)
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

    def _publish_timed_out(self, timed_out: int, of: int, error: Exception | None = None) -> float:
        """Back off and shrink the batch as for an outage; the delay before the events are due again.

        The broker may have stored them: each repeat is a copy, so repeats
        slow down and shrink while timeouts repeat (bound: docs/delivery.md).
        """
        delay = self._timeouts.next_delay()
        self._limits.publish_timed_out()
        # Not attempts spent in the table (the broker may have them), but attempts it did not acknowledge:
        # the "Publishing fails" alert (docs/operations.md) must see a broker that times out.
        self.metrics.failed_attempts.inc(timed_out)
        self._resume_claims_at = max(self._resume_claims_at, time.monotonic() + delay)
        logger.warning(
            "no acknowledgement in time, releasing %d of %d events for %.1fs; next batches at most %d events%s",
            timed_out,
            of,
            delay,
            self._limits.count,
            f": {error}" if error else "",
            extra={"action": "release_timed_out", "batch_size": of},
        )
        return delay

    def _publish_acknowledged(self) -> None:
        self._limits.published()
        if self._timeouts.failures and not self._limits.shrunk_by_timeouts:
            logger.info("the broker acknowledges full batches in time again", extra={"action": "timeouts_over"})
            self._timeouts.reset()

    def _judge(self, events: Sequence[Event], outcomes: Sequence[Outcome]) -> Verdict:
        return judge(events, outcomes, self.settings, self._backoff, self.metrics)

    async def _drain(self) -> None:
        """Let the batches in hand finish publishing and settle (each is bounded)."""
        if self._inflight:
            logger.info("stopping: finishing %d batches in hand", len(self._inflight), extra={"action": "drain"})
            for task in await self._batches_done(asyncio.ALL_COMPLETED):
                if not task.cancelled() and task.exception() is not None:
                    logger.error("a batch failed while stopping: %r", task.exception(), extra={"action": "drain_error"})
        with contextlib.suppress(Exception):
            await self.sink.close()
        with contextlib.suppress(Exception):
            await self.store.close()
