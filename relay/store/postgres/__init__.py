"""The PostgreSQL store, with psycopg 3.

- :mod:`.connection`: connection settings, error translation, a deadline on every call;
- :mod:`.store`: the relay's hot path (claim, settle, release, reap, wait): the ``Store`` port;
- :mod:`.monitoring`: status counts, the relays' gauges, the oldest pending age;
- :mod:`.admin`: the operator's commands: the ``Admin`` port.
"""

from relay.store.postgres.admin import PURGE_BATCH_SIZE, PostgresAdmin
from relay.store.postgres.connection import (
    CALL_MARGIN_SECONDS,
    STATEMENT_TIMEOUT_SECONDS,
    connect_kwargs,
    describe,
    password_of,
    translate_errors,
)
from relay.store.postgres.monitoring import GAUGES_EXACT_UP_TO
from relay.store.postgres.store import PostgresStore

__all__ = [
    "CALL_MARGIN_SECONDS",
    "GAUGES_EXACT_UP_TO",
    "PURGE_BATCH_SIZE",
    "STATEMENT_TIMEOUT_SECONDS",
    "PostgresAdmin",
    "PostgresStore",
    "connect_kwargs",
    "describe",
    "password_of",
    "translate_errors",
]
