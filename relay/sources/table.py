"""The table source: batches claimed from the outbox table with short leases, settled row by row.

The first adapter of the source port (:mod:`relay.sources.port`), over a
:class:`relay.store.base.Store`. A batch's confirm is its settle, then the
release of what goes back, retried through database outages while its lease
lasts: past the lease another relay may claim the events again, a duplicate
and not a loss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from tenacity import AsyncRetrying, retry_if_exception_type

from relay.backoff import Backoff, log_before_sleep
from relay.errors import StoreUnavailable
from relay.store.base import Claim, Dead, Retry, Settlement, Started, Store

logger = logging.getLogger(__name__)


class TableSource:
    """The outbox table as a source: claims, settles, releases and renewals of ``store``."""

    def __init__(self, store: Store, *, max_attempts: int) -> None:
        """``max_attempts``: a claim dead-letters (MySQL) or never leases events past it."""
        self.store = store
        self._max_attempts = max_attempts

    async def open(self) -> None:
        """Connect the store and check the table exists."""
        await self.store.open()

    async def check(self) -> None:
        """Raise ``StoreUnavailable`` unless the database answers now and takes writes."""
        await self.store.check()

    async def close(self) -> None:
        """Disconnect the store."""
        await self.store.close()

    async def take(self, limit: int, *, max_bytes: int, chain: Sequence[Claim] = ()) -> Started:
        """Start a claim (:meth:`Store.start_claim`)."""
        return await self.store.start_claim(limit, max_attempts=self._max_attempts, max_bytes=max_bytes, chain=chain)

    async def give_back(self, batch: Claim, ids: Sequence[int], *, delay_seconds: float = 0.0) -> None:
        """Release ``ids`` unpublished (:meth:`Store.release`)."""
        await self.store.release(batch, ids, delay_seconds=delay_seconds)

    async def renew(self, batch: Claim) -> set[int]:
        """Renew the batch's leases (:meth:`Store.renew`)."""
        return await self.store.renew(batch)

    async def wait(self, timeout: float) -> bool:
        """Wait for a NOTIFY (:meth:`Store.wait`)."""
        return await self.store.wait(timeout)

    async def confirm(
        self,
        batch: Claim,
        lease_ends: float,
        *,
        sent: Sequence[int] = (),
        retry: Sequence[Retry] = (),
        dead: Sequence[Dead] = (),
        release: Mapping[float, Sequence[int]] | None = None,
    ) -> Settlement | None:
        """Settle, then release (``{delay_seconds: ids}``), retrying until ``lease_ends`` (monotonic).

        None when there was nothing to settle, or the lease ended first.
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
                settlement = await self.store.settle(batch, sent=sent, retry=retry, dead=dead)
                must_settle = False
            while releases:
                delay, ids = releases[0]
                await self.store.release(batch, ids, delay_seconds=delay)
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
                extra={"action": "settle_abandoned", "batch_size": len(batch.events)},
            )
            return None
        return settlement
