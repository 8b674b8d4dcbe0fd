"""pika's connection parameters from a sink URL, and pika's errors in a few words.

Both are where a password could leak: the URL holds it, and pika's errors may
echo what they were given.
"""

from __future__ import annotations

import math
from urllib.parse import parse_qsl, urlsplit

import pika
import pika.exceptions

from relay.errors import ConfigError
from relay.secrets import Scrubber

#: pika's URL options that are seconds, read as floats.
_SECONDS_OPTIONS = frozenset({"socket_timeout", "stack_timeout", "blocked_connection_timeout", "retry_delay"})


def connection_parameters(
    url: str, connect_timeout: float, heartbeat: int, blocked_timeout: float
) -> pika.URLParameters:
    """pika parameters from ``url``, with our defaults where the URL sets nothing."""
    try:
        params = pika.URLParameters(url)
    except Exception as exc:  # noqa: BLE001 - pika's option parsing raises what ast.literal_eval raises, SyntaxError too
        # The message, never the traceback: a SyntaxError's carries the option's text, secrets and all.
        reason = Scrubber.of(url)(f"{type(exc).__name__}: {exc}")
        # Nor the URL: a raw '&' in an option's value makes part of it look like another option.
        raise ConfigError(f"invalid RabbitMQ sink URL (host {urlsplit(url).hostname!r}): {reason}") from None
    given = {key for key, _ in parse_qsl(urlsplit(url).query)}
    for name in _SECONDS_OPTIONS & given:
        # pika takes NaN and infinity (its check is "not <= 0"): no wait ends on NaN, nor on infinity.
        value = getattr(params, name)
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"RabbitMQ sink option {name}={value!r} is not a finite number of seconds")
    if "heartbeat" not in given:
        params.heartbeat = heartbeat
    if "blocked_connection_timeout" not in given:
        params.blocked_connection_timeout = blocked_timeout
    if "socket_timeout" not in given:
        params.socket_timeout = connect_timeout
    if "stack_timeout" not in given:
        params.stack_timeout = connect_timeout
    if "client_properties" not in given:
        params.client_properties = {"connection_name": "outbox-relay"}
    return params


def root_cause(error: str | BaseException) -> str | BaseException:
    """Dig through pika's connection-workflow wrappers to the error that happened."""
    for _ in range(8):
        inner = getattr(error, "exceptions", None)
        if isinstance(inner, list) and inner and isinstance(inner[-1], BaseException):
            error = inner[-1]
            continue
        inner = getattr(error, "exception", None)
        if isinstance(inner, BaseException):
            error = inner
            continue
        if (
            type(error) is pika.exceptions.AMQPConnectionError
            and error.args
            and isinstance(error.args[0], BaseException)
        ):
            error = error.args[0]
            continue
        break
    return error


def describe(error: str | BaseException) -> str:
    """A short description of a pika error (its root cause)."""
    root = root_cause(error)
    if isinstance(root, OSError):
        return root.strerror or type(root).__name__
    if isinstance(root, pika.exceptions.ConnectionClosed):
        return f"{root.reply_code} {root.reply_text}"
    if isinstance(root, BaseException):
        detail = " ".join(str(arg) for arg in root.args)
        return f"{type(root).__name__}: {detail}" if detail else type(root).__name__
    return root
