"""``publish(..., via="message")``: an event as a transactional logical message, no table row.

The relay's log source (``outbox-relay run --source log``) reads messages with
the prefix ``outbox`` from its slot. The envelope is a JSON object::

    {"topic": "...", "key": "..." | null, "payload": <JSON>, "headers": {...}, "idempotency_key": "..."}

and for a bytes payload ``"payload": "<base64>"`` with ``"content_type"``. There is
no unique index behind a message: the same idempotency key written twice is
delivered twice (consumers dedupe by it, as they must for any at-least-once
delivery).
"""

from __future__ import annotations

import base64
import json
from typing import Any

#: The prefix of outbox messages (the relay's ``relay.sources.log.decode.MESSAGE_PREFIX``).
MESSAGE_PREFIX = "outbox"
#: SELECT FROM: the caller needs no LSN back, and a row of no columns is less for psycopg to set up
#: (2-3 us of a ~160 us commit, measured interleaved against SELECT pg_logical_emit_message(...)).
EMIT = "SELECT FROM pg_logical_emit_message(true, 'outbox', %s::text)"
VIAS = ("table", "message")
#: ``json.dumps`` of a string or None, without its check of every option at each call.
_json = json.JSONEncoder().encode


def check_via(via: object, *, deliver_at: object, priority: object, mysql: bool) -> bool:
    """Whether to write a message; raise for what a message cannot carry."""
    if via not in VIAS:
        raise ValueError(f"via must be 'table' or 'message', not {via!r}")
    if via == "table":
        return False
    if mysql:
        raise TypeError("via='message' needs PostgreSQL (logical decoding): MySQL and MariaDB have no logical messages")
    if deliver_at is not None:
        raise ValueError("via='message' delivers at commit: deliver_at needs the table (via='table')")
    if priority != 0:
        raise ValueError("via='message' delivers in commit order: priority needs the table (via='table')")
    return True


def envelope(params: dict[str, Any]) -> str:
    """The message's JSON envelope, from ``publish``'s checked parameters."""
    if "content_type" in params:
        payload = f'"{base64.b64encode(params["payload"]).decode()}", "content_type": {_json(params["content_type"])}'
    else:
        text = params["payload_json"]
        payload = "null" if text is None else text
    headers = f', "headers": {params["headers_json"]}' if params["headers"] else ""
    return (
        f'{{"topic": {_json(params["topic"])}, "key": {_json(params["key"])}, "payload": {payload}{headers}, '
        f'"idempotency_key": {_json(params["idempotency_key"])}}}'
    )
