"""Retention: delete kept (sent or skipped) events once they are old enough."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relay.errors import StoreUnavailable
from relay.store.base import Admin

logger = logging.getLogger(__name__)

PURGE_INTERVAL_SECONDS = 60.0


async def purge_forever(store: Admin, retention_seconds: float, stop: asyncio.Event) -> None:
    """Every minute, purge what is older than ``retention_seconds``, until ``stop``.

    Each purge deletes in small batches (see ``Admin.purge``) so it
    never holds long locks. A database outage is waited out; anything else
    propagates and stops the relay.
    """
    while not stop.is_set():
        try:
            deleted = await store.purge(retention_seconds)
        except StoreUnavailable as exc:
            logger.warning("retention purge skipped: %s", exc, extra={"action": "purge_retry"})
        else:
            if deleted:
                logger.info("purged %d kept events", deleted, extra={"action": "purge", "deleted": deleted})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PURGE_INTERVAL_SECONDS)
