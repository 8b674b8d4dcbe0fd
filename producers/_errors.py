"""What ``publish`` raises and warns about beyond Python's own errors: a key another writer took, and a
connection that would commit the event on its own."""

from __future__ import annotations


class IdempotencyKeyTaken(ValueError):
    """The idempotency key holds an event of another topic: another writer of the table took it.

    Nothing was written, and the caller's transaction goes on.
    """


class AutocommitWarning(UserWarning):
    """An event published on a connection in autocommit mode outside a transaction: it commits on its own."""
