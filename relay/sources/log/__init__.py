"""The log source: deliver from a PostgreSQL logical replication slot (pgoutput).

- :mod:`.pgoutput`: the replication stream's frames and pgoutput's messages, parsed.
- :mod:`.decode`: outbox rows and ``outbox`` messages turned into events.
- :mod:`.stream`: the replication connection (``START_REPLICATION``, standby status updates).
- :mod:`.reader`: the stream's frames turned into events in the window, in commit order.
- :mod:`.window`: the events in flight, and the position that may be confirmed.
- :mod:`.queue`: one leadership's events: ready, taken, blocked behind their key, done.
- :mod:`.handover`: events handed over to the table (parked behind a dead letter), delivered from it.
- :mod:`.slot`: the publication and the slot (``migrate --source log``), leadership, slot health.
- :mod:`.leader`: the slot's reader in the background: leadership, the stream, the confirm, the slot's health.
- :mod:`.source`: :class:`LogSource`, the source port's second adapter, which the loop drives
  (:class:`relay.log_relay.LogRelay`).
"""
