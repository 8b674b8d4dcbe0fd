"""Signal handling: SIGTERM and SIGINT set the stop event."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT while inside; restore the old handlers after.

    A second signal while stopping is logged and ignored: the batches in hand
    are bounded by the publish timeout, and cutting them short would only
    turn settled work into duplicates.
    """
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            logger.warning("already stopping", extra={"action": "signal_repeat"})
            return
        logger.info("received %s, stopping", signal.Signals(signum).name, extra={"action": "signal"})
        stop.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        yield
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
