"""The database side of the relay: the ports ``Store`` (the relay's) and ``Admin`` (the operator's).

Their data types are in :mod:`relay.store.base`; the adapters are
:mod:`relay.store.postgres` and, for unit tests, :mod:`relay.store.memory`.
"""

from relay.store.base import Admin, Store

__all__ = ["Admin", "Store"]
