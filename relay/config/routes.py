"""Routes: which topics go to which sink (``--route PATTERN=URL``, ``RELAY_ROUTES``, ``--sink`` as the
catch-all), parsed and checked in order."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from relay.config.sink_urls import SinkConfig, parse_sink_url
from relay.errors import ConfigError
from relay.secrets import is_secret_option, redact_url


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """Events whose topic matches ``pattern`` go to ``sink``.

    ``pattern`` is a case-sensitive shell-style glob (:func:`fnmatch.fnmatchcase`:
    ``*``, ``?``, ``[seq]``; ``*`` also matches dots). ``label`` is the sink URL
    with its secrets masked: it names the sink in logs, errors and metrics.
    """

    pattern: str
    sink: SinkConfig
    label: str


def parse_route(text: str) -> RouteConfig:
    """Parse ``PATTERN=URL`` (split at the first ``=``; URLs may hold more)."""
    pattern, sep, url = text.strip().partition("=")
    pattern = pattern.strip()
    if not sep or "://" in pattern:
        raise ConfigError(
            f"invalid route {redact_url(text)[:120]!r}: use PATTERN=URL, e.g. 'billing.*=kafka://host:9092'"
        )
    if not pattern:
        raise ConfigError(f"invalid route {redact_url(url)[:120]!r}: the topic pattern before '=' is empty")
    if any(c.isspace() for c in pattern):
        raise ConfigError(f"invalid route pattern {pattern[:80]!r}: no whitespace (use ? to match a space)")
    url = url.strip()
    if not url:
        raise ConfigError(f"route {pattern[:80]!r} has no sink URL after '='")
    try:
        sink = parse_sink_url(url)
    except ConfigError as exc:
        raise ConfigError(f"route {pattern[:80]!r}: {exc}") from None
    return RouteConfig(pattern=pattern, sink=sink, label=redact_url(url))


def split_routes(text: str) -> list[str]:
    """The routes in ``RELAY_ROUTES``: separated by whitespace (spaces or newlines).

    A raw space in a route's password cuts it, and what follows is no route: it
    is kept with its route (which then fails as a URL holding a space) instead
    of being read, and echoed, as routes of its own. A piece is taken for such
    a rest when it has no ``://`` and either its route lacks the ``@`` that this
    piece or one after it (before the next URL) holds, or it follows a secret
    option's value.
    """
    chunks = text.split()
    routes: list[str] = []
    for n, chunk in enumerate(chunks):
        if routes and _rest_of_a_secret(routes[-1], chunk, chunks[n + 1 :]):
            routes[-1] += " " + chunk
        else:
            routes.append(chunk)
    return routes


def _rest_of_a_secret(route: str, chunk: str, after: Sequence[str]) -> bool:
    if "://" in chunk or "://" not in route:
        return False
    after_scheme = route.split("://", 1)[1]
    if "@" not in after_scheme:
        for piece in (chunk, *after):
            if "://" in piece:
                break
            if "@" in piece:
                return True
    last_option = after_scheme.rpartition("?")[2].rpartition("&")[2]
    name, equals, _ = last_option.partition("=")
    return bool(equals) and "=" not in chunk and is_secret_option(name)


def resolve_routes(routes: Sequence[str], sink: str | None) -> tuple[RouteConfig, ...]:
    """Every ``--route`` in order, then ``--sink`` (if given) as the catch-all ``*``."""
    resolved = [parse_route(route) for route in routes]
    if resolved and sink:
        resolved.append(RouteConfig(pattern="*", sink=parse_sink_url(sink), label=redact_url(sink)))
    for earlier, later in itertools.pairwise(resolved):
        # First match wins: anything after a catch-all is a mistake, not a fallback.
        if earlier.pattern == "*":
            what = "--sink" if later is resolved[-1] and sink else f"route {later.pattern!r}"
            raise ConfigError(f"{what} comes after the catch-all route '*' and would never be used")
    return tuple(resolved)
