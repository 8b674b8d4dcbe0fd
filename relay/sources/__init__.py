"""Sources: where events come from and how their delivery is confirmed.

Two sources, chosen with ``--source`` (``RELAY_SOURCE``):

- ``table`` (the default): the outbox table, claimed with short leases and
  settled row by row. Its relay is :class:`relay.loop.Relay` over a
  :class:`relay.store.base.Store`.
- ``log``: PostgreSQL's logical decoding (:mod:`relay.sources.log`). A slot
  streams the committed INSERTs into the outbox table and the transactional
  logical messages with the prefix ``outbox``, in commit order; a position is
  confirmed once every event below it was acknowledged or dead-lettered.

This seam is the smallest one the log source needs (issue 38); the source port
of issue 37 will put both behind one interface. Both relays publish through the
same sinks, judge outcomes with :func:`relay.outcomes.judge`, keep dead letters
in the outbox table (where ``dead``, ``requeue`` and ``skip`` find them), and
expose ``alive()``, ``metrics``, ``sink`` and ``store`` to the health server.
"""

from __future__ import annotations

TABLE = "table"
LOG = "log"
SOURCES = (TABLE, LOG)
