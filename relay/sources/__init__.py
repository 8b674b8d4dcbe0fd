"""Sources: where events come from and how their delivery is confirmed.

Two sources, chosen with ``--source`` (``RELAY_SOURCE``):

- ``table`` (the default): the outbox table, claimed with short leases and
  settled row by row (:class:`relay.sources.table.TableSource`, the first
  adapter of the source port, :mod:`relay.sources.port`). Its relay is
  :class:`relay.loop.Relay`, which hands each batch to :mod:`relay.batch`.
- ``log``: PostgreSQL's logical decoding (:mod:`relay.sources.log`). A slot
  streams the committed INSERTs into the outbox table and the transactional
  logical messages with the prefix ``outbox``, in commit order; a position is
  confirmed once every event below it was acknowledged or dead-lettered.

The log source has its own relay for now (issue 38): its reader and window
confirm a position, not a batch, and do not fit the port's take and confirm
yet. Both relays hand their batches to the same sinks and charge the answers
in the same room (:func:`relay.batch.life.hand_to_sink`,
:class:`relay.batch.costs.Costs`), keep dead letters
in the outbox table (where ``dead``, ``requeue`` and ``skip`` find them), and
expose ``alive()``, ``metrics``, ``sink`` and ``store`` to the health server.
"""

from __future__ import annotations

TABLE = "table"
LOG = "log"
SOURCES = (TABLE, LOG)
