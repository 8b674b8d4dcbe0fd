"""The CloudEvents ``source`` attribute: its default (from the database name and the table), and the
checks on one given with ``--event-source``, which goes out with every event."""

from __future__ import annotations

import re
from urllib.parse import quote, unquote, urlsplit

from relay import uri_reference
from relay.config.tables import TableName
from relay.errors import ConfigError
from relay.secrets import Scrubber, ambiguity, holds_secret, redact_url

#: What every default CloudEvents ``source`` starts with (see :func:`default_event_source`).
EVENT_SOURCE_PREFIX = "/outbox-relay"
EVENT_SOURCE_MAX_CHARS = 2048
#: One ``keyword = value`` of a libpq keyword string, read as libpq reads it: a value quoted, or up to
#: a space; a backslash takes the next character as it is in either.
_KEYWORD_PAIR = re.compile(r"\s*([^\s=]+)\s*=\s*('(?:\\.|[^'\\])*'|(?:\\.|[^\s\\])*)")


def default_event_source(database_url: str, table: TableName) -> str:
    """The CloudEvents ``source`` when ``--event-source`` is not given: ``/outbox-relay/<database>/<table>``.

    Only the database name is taken from ``database_url``: never its user,
    password or host. The name is percent-encoded, and anything in it that is
    also a secret of the URL (a database named like its password) is masked.
    """
    database = ""
    if "://" in database_url:
        try:
            parts = urlsplit(database_url)
        except ValueError:
            parts = None
        if parts is not None:
            # As libpq decodes a URI's parameters: %XX only ('+' is no space), the last one winning.
            query = {
                unquote(name): unquote(value) for name, _, value in (p.partition("=") for p in parts.query.split("&"))
            }
            database = query.get("dbname") or unquote(parts.path.lstrip("/"))
    else:
        database = _keyword_dbname(database_url)
    names = [quote(database, safe=""), str(table)] if database else [str(table)]
    source = "/".join([EVENT_SOURCE_PREFIX, *names])
    return Scrubber.of(database_url)(source)


def _keyword_dbname(conninfo: str) -> str:
    """The ``dbname`` of a libpq keyword string as libpq reads it: the last one given, its escapes
    undone, never a ``dbname=`` inside another keyword's quoted value; empty if it has none."""
    database, position = "", 0
    while (pair := _KEYWORD_PAIR.match(conninfo, position)) is not None and pair.end() > position:
        name, value = pair.groups()
        position = pair.end()
        if name == "dbname":
            database = re.sub(r"\\(.)", r"\1", value[1:-1] if value.startswith("'") else value)
    return database


#: Characters RFC 3986 allows nowhere in a URI, unless percent-encoded.
_NOT_IN_URIS = frozenset('<>"{}|\\^`')


def check_event_source(text: str) -> str:
    """Return ``text`` if it can be a CloudEvents ``source``: a URI-reference with no credentials.

    ``ConfigError`` if it is empty, holds whitespace or control characters,
    names a user or password (``scheme://user:pass@host``), holds anything
    else :mod:`relay.secrets` classes as secret (``?sig=``, ``?token=``), or is no
    URI-reference of RFC 3986 (:mod:`relay.uri_reference`): the source goes
    out with every event.
    """
    if not text:
        raise ConfigError("--event-source is empty: give a URI-reference, e.g. /shop/orders or urn:shop:orders")
    # A network-path reference (//user:pass@host/...) is read with a stand-in scheme, so that
    # its user and password are found, and masked, as in scheme://user:pass@host.
    as_url = "x:" + text if text.startswith("//") else text
    shown = repr((redact_url(as_url).removeprefix("x:") if as_url is not text else redact_url(text))[:80])
    if len(text) > EVENT_SOURCE_MAX_CHARS or any(c.isspace() or not c.isprintable() for c in text):
        raise ConfigError(
            f"invalid --event-source {shown}: a URI-reference of at most "
            f"{EVENT_SOURCE_MAX_CHARS} characters, without spaces or control characters"
        )
    _, separator, rest = as_url.partition("://")
    if separator and "@" in re.split(r"[/?#]", rest, maxsplit=1)[0]:
        raise ConfigError(f"--event-source {shown} holds a user or password: it goes out with every event")
    # A password cut by a raw '/', '?' or '#' hides from the test above; ambiguity() finds its '@'.
    cut = ambiguity(as_url)
    if cut is not None:
        raise ConfigError(f"invalid --event-source {shown}: it {cut}")
    if holds_secret(text):  # what relay.secrets masks: a token, a secret option (?password=, ?sig=)
        raise ConfigError(f"--event-source {shown} holds a secret (a token or password): it goes out with every event")
    problem = next((f"{c!r} must be percent-encoded" for c in text if c in _NOT_IN_URIS), None)
    if problem is None:
        # RFC 3986's grammar decides (urlsplit takes almost anything), and names what breaks it.
        problem = uri_reference.problem(text)
    if problem is None:
        try:
            _ = urlsplit(text).port  # reading the port checks it is below 65536 too
        except ValueError:  # (its message would echo the text after the ':', a password's piece perhaps)
            problem = "a port past 65535"
    if problem is not None:
        raise ConfigError(f"invalid --event-source {shown}: not a URI-reference ({problem})")
    return text
