"""The MySQL 8 / MariaDB store, with asyncmy (and PyMySQL for ``migrate``).

- :mod:`.connection`: URLs, session settings (READ COMMITTED, UTC), error translation, deadlines;
- :mod:`.runs`: which locked candidates a claim leases (the per-key rules);
- :mod:`.store`: the relay's hot path, the two-step claim: the ``Store`` port;
- :mod:`.admin`: the operator's commands: the ``Admin`` port;
- :mod:`.migrate`: ``outbox-relay migrate`` on MySQL.
"""

from relay.store.mysql.admin import PURGE_BATCH_SIZE, MySQLAdmin
from relay.store.mysql.connection import SCHEMES, Target
from relay.store.mysql.store import BinlogUnsafe, MySQLStore, check_binlog

__all__ = [
    "PURGE_BATCH_SIZE",
    "SCHEMES",
    "BinlogUnsafe",
    "MySQLAdmin",
    "MySQLStore",
    "Target",
    "check_binlog",
]
