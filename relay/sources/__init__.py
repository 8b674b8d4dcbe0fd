"""Sources: where events come from and how their delivery is confirmed.

Two sources, chosen with ``--source`` (``RELAY_SOURCE``):

- ``table`` (the default): the outbox table, claimed with short leases and
  settled row by row (:class:`relay.sources.table.TableSource`, the first
  adapter of the source port, :mod:`relay.sources.port`).
- ``log``: PostgreSQL's logical decoding (:mod:`relay.sources.log`). A slot
  streams the committed INSERTs into the outbox table and the transactional
  logical messages with the prefix ``outbox``, in commit order; a position is
  confirmed once every event below it was acknowledged or dead-lettered.

Both are adapters of the source port, and one loop (:class:`relay.loop.Relay`)
drives them: the log's relay (:class:`relay.log_relay.LogRelay`) is that loop
over :class:`relay.sources.log.source.LogSource`. Their batches live in the
same room (:mod:`relay.batch`: turns, key holds, judging, costs), dead letters
stay in the outbox table (where ``dead``, ``requeue`` and ``skip`` find them),
and ``alive()``, ``metrics``, ``sink`` and ``source`` serve the health server.
"""

from __future__ import annotations

TABLE = "table"
LOG = "log"
SOURCES = (TABLE, LOG)
