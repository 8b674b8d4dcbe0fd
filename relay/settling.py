"""Recording a batch's outcome while its lease lasts: settle, then release, through database outages."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from tenacity import AsyncRetrying, retry_if_exception_type

from relay.backoff import Backoff, log_before_sleep
from relay.errors import StoreUnavailable
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
