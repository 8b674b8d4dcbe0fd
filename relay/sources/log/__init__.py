"""The log source: deliver from a PostgreSQL logical replication slot (pgoutput).

- :mod:`.pgoutput`: the replication stream's frames and pgoutput's messages, parsed.
- :mod:`.decode`: outbox rows and ``outbox`` messages turned into events.
- :mod:`.stream`: the replication connection (``START_REPLICATION``, standby status updates).
- :mod:`.reader`: the stream's frames turned into events in the window, in commit order.
- :mod:`.window`: the events in flight, and the position that may be confirmed.
- :mod:`.handover`: events handed over to the table (parked behind a dead letter), delivered from it.
- :mod:`.slot`: the publication and the slot (``migrate --source log``), leadership, slot health.
- :mod:`.relay`: :class:`LogRelay`, reading, publishing, confirming.
"""
