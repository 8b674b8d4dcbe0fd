"""The PostgreSQL store, with psycopg 3.

- :mod:`.connection`: connection settings and a deadline on every call (``Database``);
- :mod:`.errors`: psycopg's errors translated into the relay's, without secrets;
- :mod:`.statements`: named queries as they are sent, and their rows read by column name;
- :mod:`.store`: the relay's hot path (claim, settle, release, reap, wait): the ``Store`` port;
- :mod:`.monitoring`: status counts, the relays' gauges, the oldest pending age;
- :mod:`.admin`: the operator's commands: the ``Admin`` port.
"""

from relay.store.postgres.admin import PURGE_BATCH_SIZE, PostgresAdmin
from relay.store.postgres.connection import CALL_MARGIN_SECONDS, STATEMENT_TIMEOUT_SECONDS, connect_kwargs
from relay.store.postgres.errors import describe, password_of, translate_errors
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
