"""Migrations that wait for the table's lock behind an application's open transaction.

A DDL statement that waits for the table's lock makes every later INSERT and
claim of the table queue behind it, for as long as the transaction that holds
the lock stays open. So ``migrate`` waits a short while for each lock
(:data:`LOCK_WAIT_SECONDS`, the most it holds writers up), lets go, and tries
again with backoff for :data:`LOCK_RETRY_SECONDS`; when it gives up, its error
names the sessions that held the table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from relay.errors import StoreUnavailable

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long one DDL statement of ``migrate`` waits for the table's lock before it lets go: writers and
#: relays that come after it queue behind its wait, so this is the most a migration holds them up.
LOCK_WAIT_SECONDS = 2.0
#: How long ``migrate`` keeps trying, backing off between tries, while transactions hold the table.
LOCK_RETRY_SECONDS = 60.0
#: The longest pause between two tries.
_MAX_BACKOFF_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Holder:
    """A session that held a lock on the table when a migration's wait ended. No query text: it may hold
    an application's payload."""

    session: int
    user: str
    application: str
    state: str
    transaction_seconds: float | None

    def __str__(self) -> str:
        open_for = "" if self.transaction_seconds is None else f", transaction open {self.transaction_seconds:.0f}s"
        application = f" ({self.application})" if self.application else ""
        return f"session {self.session} of {self.user}{application}, {self.state or 'state unknown'}{open_for}"


class LockWaitTimeout(StoreUnavailable):
    """A migration waited its short while for the table's lock, which an open transaction held."""

    def __init__(self, table: object, wait_seconds: float, holders: Sequence[Holder]) -> None:
        named = "; ".join(map(str, holders)) if holders else "no session holds it now"
        super().__init__(
            f"table {table}: a lock on it was not granted within {wait_seconds:g}s (held by {named}): "
            "commit or end that transaction, then migrate again"
        )
        self.holders = tuple(holders)


def retrying(attempt: Callable[[], T], *, retry_seconds: float) -> T:
    """``attempt()``, tried again with backoff while it raises :class:`LockWaitTimeout`, for up to
    ``retry_seconds``; then its last error."""

    def log(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        logger.warning("migrate waits for the table: %s", error, extra={"action": "migrate_lock_wait"})

    for try_ in Retrying(
        retry=retry_if_exception_type(LockWaitTimeout),
        stop=stop_after_delay(retry_seconds),
        wait=wait_random_exponential(multiplier=0.25, max=_MAX_BACKOFF_SECONDS),
        before_sleep=log,
        reraise=True,
    ):
        with try_:
            return attempt()
    raise AssertionError("unreachable: Retrying returns or raises")  # pragma: no cover
