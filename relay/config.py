"""Configuration values, validated once at the edge.

Nothing here reads the environment: the CLI does that and passes plain values
in. Every parser raises :class:`ConfigError` with a one-line message that never
contains a password.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from relay import uri_reference
from relay.errors import ConfigError
from relay.kafka_options import check_value, option_name
from relay.secrets import Scrubber, ambiguity, holds_secret, shown_before_space

# What is secret is decided in relay.secrets; these two stay importable from here.
from relay.secrets import is_secret_option as is_secret_option
from relay.secrets import redact_url as redact_url

DEFAULT_TABLE = "outbox"
BATCH_SIZE = 4000
MAX_ATTEMPTS = 10
BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0
LEASE_SECONDS = 60.0
PUBLISH_TIMEOUT_SECONDS = 30.0
#: Below this no broker acknowledges in time: every publish would time out and be repeated.
MIN_PUBLISH_TIMEOUT_SECONDS = 0.1
#: Where /metrics and the health endpoints listen unless told: this host only.
DEFAULT_METRICS_HOST = "127.0.0.1"
POLL_INTERVAL_SECONDS = 0.5
POLL_INTERVAL_MAX_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 10.0
#: The most bytes of UTF-8 in an AMQP 0-9-1 short string: an exchange or vhost name, a routing key.
AMQP_SHORTSTR_MAX_BYTES = 255
PIPELINE_DEPTH = 2
#: A claim stops adding events once their payloads reach this many bytes (always at least one event).
BATCH_BYTES = 16 * 1024 * 1024
#: The least a lease must leave for the claim itself, before its batch is published.
CLAIM_RESERVE_SECONDS = 1.0
#: Kept at the end of a lease for the settle that records a batch's outcome (short statements).
SETTLE_RESERVE_SECONDS = 1.0

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
_TABLE_RE = re.compile(rf"^(?:({_IDENT})\.)?({_IDENT})$")
#: The same without the length limit, so that a name too long is told so, not that its characters are wrong.
_LONG_TABLE_RE = re.compile(r"^(?:([A-Za-z_][A-Za-z0-9_]*)\.)?([A-Za-z_][A-Za-z0-9_]*)$")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The longest identifier PostgreSQL keeps whole (NAMEDATALEN - 1; MySQL's is 64).
MAX_IDENTIFIER_CHARS = 63
#: The longest table name: the names of its indexes and constraints are the
#: name, ``_`` and a suffix, cut at 63 characters (PostgreSQL's limit; MySQL's
#: is 64), and past 45 two of them come out the same (``_idempotency_key_check``
#: and ``_idempotency_key_key``), which ``migrate`` cannot create.
MAX_TABLE_NAME_CHARS = 45


@dataclass(frozen=True, slots=True)
class TableName:
    """A validated, optionally schema-qualified outbox table name.

    Only plain identifiers are accepted (letters, digits, underscores), so the
    name can be quoted with ``psycopg.sql.Identifier`` and never needs escaping.
    """

    schema: str | None
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """Validate ``schema.table`` or ``table``; raise ``ConfigError`` otherwise."""
        match = _TABLE_RE.match(text) or _LONG_TABLE_RE.match(text)
        if match is not None and len(match.group(1) or "") > MAX_IDENTIFIER_CHARS:
            raise ConfigError(
                f"invalid table name {text[:80]!r}: a schema name has at most {MAX_IDENTIFIER_CHARS} characters"
            )
        if match is None:
            raise ConfigError(
                f"invalid table name {text[:80]!r}: use letters, digits and underscores, "
                "optionally schema-qualified (e.g. events.outbox)"
            )
        if len(match.group(2)) > MAX_TABLE_NAME_CHARS:
            raise ConfigError(
                f"invalid table name {text[:80]!r}: at most {MAX_TABLE_NAME_CHARS} characters after the schema, "
                "so that the names of the table's indexes and constraints stay distinct"
            )
        return cls(schema=match.group(1), name=match.group(2))

    @property
    def parts(self) -> tuple[str, ...]:
        """The identifier parts, for ``psycopg.sql.Identifier(*parts)``."""
        return (self.schema, self.name) if self.schema else (self.name,)

    def derived(self, suffix: str) -> str:
        """A name for an object that belongs to this table (index, trigger, ...)."""
        return f"{self.name}_{suffix}"[:63]

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this table: ``outbox_relay.`` and its name, or a digest of
        the name when that is too long for a channel or not plain (a schema found through search_path).

        Never cut: two tables whose names differ only past the cut would share one.
        """
        readable = f"outbox_relay.{self}"
        if all(_PLAIN.fullmatch(part) for part in self.parts) and len(readable) <= MAX_IDENTIFIER_CHARS:
            return readable
        quoted = ".".join('"' + part.replace('"', '""') + '"' for part in self.parts)
        return "outbox_relay." + hashlib.sha256(quoted.encode()).hexdigest()[:40]

    def __str__(self) -> str:
        return ".".join(self.parts)


#: Debezium's event router's default topic: ``outbox.event.`` and the aggregate type.
DEFAULT_TOPIC_TEMPLATE = "outbox.event.{aggregatetype}"
#: Kafka topic characters, and the one placeholder.
_TOPIC_TEMPLATE_RE = re.compile(r"^(?:[A-Za-z0-9._-]|\{aggregatetype\})+$")
_FIELD_HEADER_RE = re.compile(rf"^({_IDENT})=([^\s=]+)$")
TABLE_LAYOUTS = ("native", "debezium")
#: Headers every record of a Debezium table carries from the row itself: no column may stand in.
DEBEZIUM_RESERVED_HEADERS = ("id", "idempotency-key")


@dataclass(frozen=True, slots=True)
class TableLayout:
    """Which outbox table the relay reads: its own (``native``), or Debezium's.

    A ``debezium`` table has Debezium's outbox columns (``id`` uuid,
    ``aggregatetype``, ``aggregateid``, ``type``, ``payload``); the relay
    publishes each row to ``topic_template`` with ``{aggregatetype}`` filled in,
    keyed by ``aggregateid``, with an ``id`` header, and the columns of
    ``field_headers`` (column, header) as headers too. See docs/debezium.md.
    """

    name: str = "native"
    topic_template: str = DEFAULT_TOPIC_TEMPLATE
    field_headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, name: str, *, topic_template: str | None = None, field_headers: Sequence[str] = ()) -> TableLayout:
        """Validate ``--table-layout``, ``--topic-template`` and ``--field-header COLUMN=HEADER`` values."""
        if name not in TABLE_LAYOUTS:
            raise ConfigError(f"unknown table layout {name[:40]!r}: use native or debezium")
        if name == "native" and (topic_template or field_headers):
            raise ConfigError("--topic-template and --field-header go with --table-layout debezium")
        template = topic_template or DEFAULT_TOPIC_TEMPLATE
        if not _TOPIC_TEMPLATE_RE.match(template) or len(template) > 200:
            raise ConfigError(
                f"invalid topic template {template[:80]!r}: use letters, digits, '.', '_', '-' and {{aggregatetype}}"
            )
        pairs = []
        for text in field_headers:
            match = _FIELD_HEADER_RE.match(text)
            if match is None:
                raise ConfigError(f"invalid field header {text[:80]!r}: use COLUMN=HEADER, e.g. type=eventType")
            if match.group(2).lower() in DEBEZIUM_RESERVED_HEADERS:
                raise ConfigError(
                    f"invalid field header {text[:80]!r}: the header {match.group(2)!r} is the relay's own "
                    "(id is the event id, idempotency-key the key consumers drop duplicates by)"
                )
            pairs.append((match.group(1), match.group(2)))
        return cls(name, template, tuple(pairs))

    @property
    def debezium(self) -> bool:
        """Whether this is Debezium's table layout."""
        return self.name == "debezium"

    def relation(self, table: TableName) -> TableName:
        """What the relay's queries read and update: the table, or for Debezium's layout its view."""
        return TableName(table.schema, table.derived("relay")) if self.debezium else table


NATIVE = TableLayout()


# ASCII digits only: \d would take any script's digits (an Arabic-Indic seven for 7).
_DURATION_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|d|w)?\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``15m``, ``12h``, ``7d`` or ``2w``."""
    match = _DURATION_RE.match(text)
    if match is None:
        raise ConfigError(f"invalid duration {text[:40]!r}: use a number with s, m, h, d or w (e.g. 7d)")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds > MAX_DURATION_SECONDS:
        raise ConfigError(f"invalid duration {text[:40]!r}: more than a hundred years")
    return seconds


#: Past a hundred years, "now" minus or plus a duration leaves the databases' timestamp ranges.
MAX_DURATION_SECONDS = 100 * 365.25 * 24 * 3600


class Format(StrEnum):
    """How a sink shapes its messages: the sink URL option ``format=``."""

    #: The relay's own shape (CONTRACT.md, "What arrives downstream").
    NATIVE = "native"
    #: CloudEvents 1.0, binary content mode: attributes in headers, the payload as the value.
    CLOUDEVENTS = "cloudevents"
    #: CloudEvents 1.0, structured content mode: the value is an ``application/cloudevents+json`` envelope.
    CLOUDEVENTS_STRUCTURED = "cloudevents-structured"


#: The sink URL option that picks a :class:`Format`; the relay's own, never passed to a broker client.
FORMAT_OPTION = "format"
#: The sink URL option that has the relay declare its RabbitMQ exchange, and the types it may declare.
DECLARE_OPTION = "declare"
EXCHANGE_TYPES = ("topic", "direct", "fanout", "headers")


def parse_format(text: str) -> Format:
    """The :class:`Format` named ``text``; ``ConfigError`` naming the allowed ones otherwise."""
    try:
        return Format(text)
    except ValueError:
        allowed = ", ".join(f.value for f in Format)
        raise ConfigError(f"invalid sink option format={text[:40]!r}: use one of {allowed}") from None


@dataclass(frozen=True, slots=True)
class KafkaSinkConfig:
    """Where and how to reach Kafka; ``options`` are extra librdkafka settings."""

    bootstrap_servers: str
    options: dict[str, str] = field(default_factory=dict, repr=False)
    format: Format = Format.NATIVE

    def __repr__(self) -> str:
        shown = {k: ("***" if is_secret_option(k) else v) for k, v in self.options.items()}
        return (
            f"KafkaSinkConfig(bootstrap_servers={self.bootstrap_servers!r}, options={shown!r}, "
            f"format={self.format.value!r})"
        )


@dataclass(frozen=True, slots=True)
class AmqpSinkConfig:
    """Where and how to reach RabbitMQ. ``url`` is for pika and holds the password."""

    url: str = field(repr=False)
    exchange: str = ""
    format: Format = Format.NATIVE
    #: ``declare=TYPE``: the relay declares ``exchange`` (durable, of this type) on every connect,
    #: instead of only checking that it exists. None: it must exist already.
    declare: str | None = None

    def __repr__(self) -> str:
        return (
            f"AmqpSinkConfig(url={redact_url(self.url)!r}, exchange={self.exchange!r}, "
            f"format={self.format.value!r}, declare={self.declare!r})"
        )


class SinkConfig(Protocol):
    """A sink URL parsed by its kind (see :mod:`relay.sinks.registry`): ``KafkaSinkConfig``,
    ``AmqpSinkConfig`` or a registered kind's own. Frozen and comparable; its repr shows no secret."""

    @property
    def format(self) -> Format:
        """The message shape (``format=`` in the URL)."""
        ...


def parse_sink_url(url: str) -> SinkConfig:
    """Parse a sink URL (``kafka://...``, ``amqp(s)://...`` or a registered kind's) into its configuration."""
    from relay.sinks.registry import SINK_KINDS  # the kinds import this module

    url = url.strip()
    if not url:
        raise ConfigError("no sink configured: set --sink or RELAY_SINK (kafka://... or amqp://...), or --route")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if not scheme:
        # No scheme://: nothing tells a host from a password set in the URL's place, so none of it is shown.
        raise ConfigError("invalid sink URL: it has no scheme://; use kafka://... or amqp://...")
    kind = SINK_KINDS.for_scheme(scheme)
    if kind is None:
        known = " or ".join(f"{s}://" for s in SINK_KINDS.schemes())
        raise ConfigError(f"unknown sink scheme {scheme!r} in {redact_url(url)!r}: use {known}")
    problem = ambiguity(url)
    if problem is not None:
        raise ConfigError(f"invalid sink URL {shown_before_space(url)!r}: it {problem}")
    return kind.parse(url)


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


def parse_kafka_url(url: str) -> KafkaSinkConfig:
    # urlsplit cannot take a host list with ports, so split the netloc by hand.
    rest = url.split("://", 1)[1]
    netloc, _, query = rest.partition("?")
    netloc = netloc.rstrip("/")
    options: dict[str, str] = {}
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, _, password = userinfo.partition(":")
        options["sasl.username"] = unquote(user)
        options["sasl.password"] = unquote(password)
    hosts = [h for h in netloc.split(",") if h]
    if not hosts:
        raise ConfigError(f"kafka sink URL {redact_url(url)!r} names no broker (kafka://host:port)")
    for host in hosts:
        name, sep, port = host.rpartition(":")
        if not sep or not name or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            shown = Scrubber.of(url)(host)
            raise ConfigError(f"kafka broker {shown!r} in {redact_url(url)!r} is not host:port")
    chosen = Format.NATIVE
    # Under librdkafka's names: sasl_username and sasl.username, or a user in the URL, are one option.
    given = set(options)
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == FORMAT_OPTION:
            _once(url, key, given)
            chosen = parse_format(value)
            continue
        name = option_name(key)
        _once(url, name, given)
        check_value(name, value)
        options[name] = value
    return KafkaSinkConfig(bootstrap_servers=",".join(hosts), options=options, format=chosen)


def _once(url: str, name: str, given: set[str]) -> None:
    """Note option ``name`` of sink ``url`` as given; ``ConfigError`` if it was already.

    A repeat is a mistake (an edit that left the old value behind), not an
    override: taking the last silently could send to the wrong exchange or in
    the wrong format. Every option of a sink URL takes one value.
    """
    if name in given:
        shown = Scrubber.of(url)(name[:60])
        raise ConfigError(f"sink option {shown!r} is given twice in {redact_url(url)!r}: give it once")
    given.add(name)


def parse_amqp_url(url: str) -> AmqpSinkConfig:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - urlsplit checks the port lazily
    except ValueError as exc:
        raise ConfigError(f"invalid sink URL {redact_url(url)!r}: {Scrubber.of(url)(str(exc))}") from None
    if not parts.hostname:
        raise ConfigError(f"amqp sink URL {redact_url(url)!r} names no host (amqp://user:pass@host:port/vhost)")
    query = parse_qsl(parts.query, keep_blank_values=True)
    exchange = ""
    chosen = Format.NATIVE
    declare: str | None = None
    kept = []
    given: set[str] = set()
    for key, value in query:
        _once(url, key, given)
        if key == "exchange":
            exchange = value
        elif key == FORMAT_OPTION:
            chosen = parse_format(value)
        elif key == DECLARE_OPTION:
            declare = _exchange_type(url, value)
        else:
            kept.append(f"{key}={value}")
    _check_short_string(url, "exchange", exchange)
    if declare is not None and not exchange:
        raise ConfigError(
            f"sink option declare={declare} in {redact_url(url)!r} needs a named exchange (&exchange=NAME):"
            " the default exchange always exists and cannot be declared"
        )
    # As pika reads it: the path after its first "/", unquoted; none (or "/") is the default vhost.
    _check_short_string(url, "vhost", unquote(parts.path[1:]))
    pika_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), ""))
    return AmqpSinkConfig(url=pika_url, exchange=exchange, format=chosen, declare=declare)


def _exchange_type(url: str, value: str) -> str:
    """The exchange type of a ``declare=`` option; ``ConfigError`` for any other value."""
    if value not in EXCHANGE_TYPES:
        shown = Scrubber.of(url)(value[:40])
        raise ConfigError(f"invalid sink option declare={shown!r}: use one of {', '.join(EXCHANGE_TYPES)}")
    return value


def _check_short_string(url: str, what: str, name: str) -> None:
    """``ConfigError`` unless ``name`` fits an AMQP short string.

    The broker never sees a longer one: pika fails while encoding it, and the
    sink would report RabbitMQ unreachable (a route down for good) instead of
    the name that cannot work.
    """
    size = len(name.encode())
    if size > AMQP_SHORTSTR_MAX_BYTES:
        raise ConfigError(
            f"the {what} name in amqp sink URL {redact_url(url)[:80]!r}... is {size} bytes of UTF-8; "
            f"AMQP allows at most {AMQP_SHORTSTR_MAX_BYTES}"
        )


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


#: The URL schemes of the MySQL 8 / MariaDB store (relay.store.mysql).
MYSQL_SCHEMES = ("mysql", "mariadb")


def is_mysql_url(url: str) -> bool:
    """Whether ``url`` is a ``mysql://`` or ``mariadb://`` URL."""
    return "://" in url and url.split("://", 1)[0].lower() in MYSQL_SCHEMES


def check_database_url(url: str) -> str:
    """Return ``url`` if it looks like a libpq URL or keyword string, or a ``mysql://`` URL."""
    url = url.strip()  # a value read from a file often ends in a line break
    if not url:
        raise ConfigError("no database configured: set --database-url, RELAY_DATABASE_URL or DATABASE_URL")
    if any("\ud800" <= char <= "\udfff" for char in url):
        # Python keeps bytes that are not UTF-8 (a shell's argument, a variable) as lone surrogates;
        # libpq would fail on them with a traceback, and the password may be among them: not echoed.
        raise ConfigError(
            "invalid database URL: it holds bytes that are not UTF-8 (write it in UTF-8, percent-encode the rest)"
        )
    if "://" not in url and "=" not in url:
        # Neither a URL nor a keyword string (a URL that lost its '//', a password set in its place):
        # libpq's error would echo it whole, whatever secret it holds.
        raise ConfigError(
            "invalid database URL: neither scheme://... (postgresql://, mysql://) nor libpq's keyword=value pairs"
        )
    if "://" in url:
        problem = ambiguity(url)
        if problem is not None:
            raise ConfigError(f"invalid database URL {shown_before_space(url)!r}: it {problem}")
        scheme, rest = url.split("://", 1)
        url = f"{scheme.lower()}://{rest}"  # libpq takes the scheme in lower case only
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - urlsplit checks the port lazily
        except ValueError as exc:
            raise ConfigError(f"invalid database URL {redact_url(url)!r}: {Scrubber.of(url)(str(exc))}") from None
        if parts.scheme not in ("postgresql", "postgres", *MYSQL_SCHEMES):
            raise ConfigError(
                f"unknown database URL scheme {parts.scheme!r} in {redact_url(url)!r}: use postgresql:// or mysql://"
            )
    return url


def _at_least(seconds: float) -> str:
    """``seconds`` rounded up to the millisecond and written out whole: advice that, followed, passes
    (``:g`` keeps six digits, and rounded 1234567.5 down)."""
    text = f"{math.ceil(seconds * 1000 - 1e-6) / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{text} s"


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """The tunables of the relay loop, each with its unit in the name."""

    batch_size: int = BATCH_SIZE
    batch_bytes: int = BATCH_BYTES
    max_attempts: int = MAX_ATTEMPTS
    backoff_initial_seconds: float = BACKOFF_INITIAL_SECONDS
    backoff_max_seconds: float = BACKOFF_MAX_SECONDS
    lease_seconds: float = LEASE_SECONDS
    publish_timeout_seconds: float = PUBLISH_TIMEOUT_SECONDS
    poll_interval_seconds: float = POLL_INTERVAL_SECONDS
    poll_interval_max_seconds: float = POLL_INTERVAL_MAX_SECONDS
    pipeline_depth: int = PIPELINE_DEPTH
    listen: bool = True

    def __post_init__(self) -> None:
        checks = [
            (self.batch_size >= 1, "--batch-size must be at least 1"),
            (self.batch_bytes >= 1, "--batch-bytes must be at least 1"),
            (self.max_attempts >= 1, "--max-attempts must be at least 1"),
            (self.backoff_initial_seconds > 0, "--backoff-initial must be positive"),
            (
                self.backoff_max_seconds >= self.backoff_initial_seconds,
                "--backoff-max must be >= --backoff-initial",
            ),
            (
                self.publish_timeout_seconds >= MIN_PUBLISH_TIMEOUT_SECONDS,
                f"--publish-timeout must be at least {MIN_PUBLISH_TIMEOUT_SECONDS:g} s: a shorter one times out "
                "every publish, and each repeat is a copy",
            ),
            (self.poll_interval_seconds > 0, "--poll-interval must be positive"),
            (self.poll_interval_max_seconds > 0, "--poll-interval-max must be positive"),
            (self.pipeline_depth >= 1, "pipeline depth must be at least 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        # The lease is checked where the sinks are known (RunConfig, check_lease): the grace of the
        # slowest is part of what a lease must hold, and advice given without it asked for too little.

    def latest_publish_start_seconds(self, sink_grace_seconds: float = 0.0) -> float:
        """How long after its claim was sent a batch may still start publishing.

        What the lease leaves once the publish (``--publish-timeout``, plus
        ``sink_grace_seconds``: the longest the sink runs past it) and the
        settle are set aside. A batch that waited longer goes back unpublished.
        See docs/how-it-works.md, "What a lease must hold".
        """
        return self.lease_seconds - self.publish_timeout_seconds - sink_grace_seconds - SETTLE_RESERVE_SECONDS

    def check_lease(self, sink_grace_seconds: float = 0.0, sink: str = "the") -> None:
        """Raise ``ConfigError`` unless the lease holds a claim, a publish and a settle.

        ``sink_grace_seconds`` is how long the ``sink`` may run past ``--publish-timeout``.
        """
        needed = CLAIM_RESERVE_SECONDS + self.publish_timeout_seconds + sink_grace_seconds + SETTLE_RESERVE_SECONDS
        if self.lease_seconds >= needed or math.isclose(self.lease_seconds, needed):
            return
        grace = f" + {sink_grace_seconds:g} s {sink} sink may take past it" if sink_grace_seconds else ""
        raise ConfigError(
            f"--lease-seconds {self.lease_seconds:g} is too short: use at least {_at_least(needed)} (a batch needs "
            f"{CLAIM_RESERVE_SECONDS:g} s to claim + --publish-timeout {self.publish_timeout_seconds:g} s{grace} "
            f"+ {SETTLE_RESERVE_SECONDS:g} s to settle)"
        )
