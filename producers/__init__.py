"""Write events into the outbox inside the caller's own transaction.

>>> with psycopg.connect(url) as conn, conn.transaction():
...     conn.execute("INSERT INTO orders ...")
...     producers.publish(conn, "orders.created", {"order_id": 42}, key="order-42")

Nothing here commits or rolls back: the event is written if and only if the
caller's transaction commits. Plain SQL works just as well::

    INSERT INTO outbox (topic, key, payload) VALUES ('orders.created', 'order-42', '{"order_id": 42}');
"""

from __future__ import annotations

from producers._write import MAX_DELIVER_AHEAD, AutocommitWarning, IdempotencyKeyTaken, apublish, publish

__all__ = ["MAX_DELIVER_AHEAD", "AutocommitWarning", "IdempotencyKeyTaken", "apublish", "publish"]
