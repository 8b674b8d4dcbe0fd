"""Recording a batch's outcome while its lease lasts: settle, then release, through database outages;
and renewing the lease of a batch that waited too long to publish."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from tenacity import AsyncRetrying, retry_if_exception_type

from relay.backoff import Backoff, log_before_sleep
from relay.errors import StoreUnavailable
from relay.holds import KeyHolds
from relay.store.base import Claim, Dead, Retry, Settlement, Store

logger = logging.getLogger(__name__)


async def settle_within_lease(
    store: Store,
    claim: Claim,
    lease_ends: float,
    *,
    sent: Sequence[int] = (),
    retry: Sequence[Retry] = (),
    dead: Sequence[Dead] = (),
    release: Mapping[float, Sequence[int]] | None = None,
) -> Settlement | None:
    """Settle, then release (``{delay_seconds: ids}``), retrying until ``lease_ends`` (monotonic).

    None when there was nothing to settle, or the lease ended first. The
    broker has the events: past the lease another relay may claim them again,
    a duplicate and not a loss.
    """
    backoff = Backoff.for_outages()
    settlement: Settlement | None = None
    must_settle = bool(sent or retry or dead) or not release
    releases = [(delay, ids) for delay, ids in (release or {}).items() if ids]

    async def remaining_steps() -> None:
        # Each step runs once: a settle repeated after a later step failed
        # would find its rows gone and count them as lost leases.
        nonlocal settlement, must_settle
        if must_settle:
            settlement = await store.settle(claim, sent=sent, retry=retry, dead=dead)
            must_settle = False
        while releases:
            delay, ids = releases[0]
            await store.release(claim, ids, delay_seconds=delay)
            releases.pop(0)

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(StoreUnavailable),
        stop=lambda _: time.monotonic() >= lease_ends,
        # The last try comes as the lease ends, not a backoff after it.
        wait=lambda state: min(backoff(state), max(0.0, lease_ends - time.monotonic())),
        before_sleep=log_before_sleep(logger, "settle failed, retrying: %s", "settle_retry"),
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


async def renewed(store: Store, claim: Claim, holds: KeyHolds) -> Claim | None:
    """``claim`` with its lease started again, less the events it no longer holds; None if it holds none.

    A batch whose claim was slow to come back (a payload of many megabytes) or
    that waited in a stalled process has too little lease left to publish and
    settle. Giving it back unpublished would not help: the next claim would
    take as long, the event would never be tried and its key never move. So it
    keeps what it still holds, from now, and goes on.

    It holds only events whose lease has not ended (:meth:`Store.renew`): past
    it, another relay's reaper may have dead-lettered an event of the batch in
    the middle of its key's run, and the rest of the run is no longer next of
    its key. A key that lost an event sends nothing from this batch: the key
    is held and its kept events are marked chained, so the sink answers them
    held and they go back untried (:meth:`KeyHolds.hold_lost`), and so does
    any batch that went on with the key meanwhile.
    """
    try:
        kept = await store.renew(claim)
    except StoreUnavailable as exc:
        logger.warning("could not renew a stale batch's lease: %s", exc, extra={"action": "renew_failed"})
        return None
    if not kept:
        return None
    events = [e for e in claim.events if e.id in kept]
    held = holds.hold_lost([e for e in claim.events if e.id not in kept], events)
    logger.warning(
        "lease nearly over before publishing: renewed it for %d events (%d lost meanwhile, %d held behind them)",
        len(events),
        len(claim.events) - len(events),
        len(held),
        extra={"action": "renew_stale", "batch_size": len(events)},
    )
    return Claim(claim.token, events, claim.reaped)
