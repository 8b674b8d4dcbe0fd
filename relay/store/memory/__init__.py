"""An in-memory store for unit tests, with the PostgreSQL store's semantics.

The conformance suite (tests/conformance) runs the same checks against both,
so the relay loop can be unit-tested here and trusted on PostgreSQL.

- :mod:`.rows`: the table (its rows, clock and availability), and inserting into it;
- :mod:`.store`: the relay's hot path, the ``Store`` port (:class:`MemoryStore`, which has both ports);
- :mod:`.admin`: the counts and the operator's commands, the ``Admin`` port.
"""

from relay.store.memory.rows import Row
from relay.store.memory.store import MemoryStore

__all__ = ["MemoryStore", "Row"]
