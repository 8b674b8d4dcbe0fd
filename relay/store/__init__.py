"""The database side of the relay: the ports ``Store`` (the relay's) and ``Admin`` (the operator's).

The ports are in :mod:`relay.store.base`, their values in :mod:`relay.store.claims`,
:mod:`relay.store.status` and :mod:`relay.store.admin_values`; the adapters are
:mod:`relay.store.postgres`, :mod:`relay.store.mysql` and, for unit tests,
:mod:`relay.store.memory`.
"""

from relay.store.base import Admin, Store

__all__ = ["Admin", "Store"]
