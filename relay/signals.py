"""Signal handling: SIGTERM, SIGINT and SIGHUP set the stop event."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

logger = logging.getLogger(__name__)

#: SIGHUP too: a closed terminal or a supervisor's "reload" killed the relay at once, its batches
#: left to their leases. Each stops it as SIGTERM does.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT/SIGHUP while inside; restore the old handlers after, or,
    once stopping, ignore those signals from then on.

    A second signal while stopping is logged and ignored: the batches in hand
    are bounded by the publish timeout, and cutting them short would only
    turn settled work into duplicates. After the relay stopped, the process
    still closes its clients and its loop; a repeat (an orchestrator sending
    SIGTERM twice, a second Ctrl-C) must not kill it then, out of its exit 0.
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
            if stop.is_set():
                signal.signal(sig, signal.SIG_IGN)
