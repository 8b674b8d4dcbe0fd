"""The relay's own exception hierarchy.

Driver exceptions (psycopg, confluent-kafka, pika) are translated into these at
the adapter boundary, so the relay loop decides what to retry by looking only at
this hierarchy.
"""

from __future__ import annotations


class RelayError(Exception):
    """Base class for every error the relay raises on purpose."""


class ConfigError(RelayError):
    """The configuration cannot work: bad URL, unknown scheme, invalid name.

    The message is shown to the operator as one line and never holds a secret.
    """


class StoreError(RelayError):
    """The database side failed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached right now; retry after a backoff."""


class StoreReadOnly(StoreUnavailable):
    """The database takes no writes now: a hot standby, or read-only by setting."""


class ClaimTimeout(StoreUnavailable):
    """The claim hit the statement timeout: the batch was too big to read in time."""


class SchemaError(StoreError):
    """The outbox table is missing or older than this relay needs."""


class SinkError(RelayError):
    """The broker side failed."""


class SinkUnavailable(SinkError):
    """The broker cannot be reached right now; nothing in hand was delivered."""


class SinkTimeout(SinkUnavailable):
    """The broker took (some of) the batch but did not acknowledge it within the publish timeout.

    The events may have been stored: releasing them costs a copy each time, so the
    relay backs off and shrinks its batches while timeouts repeat.
    """
