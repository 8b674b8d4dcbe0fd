"""Configuration values, validated once at the edge.

Nothing here reads the environment: the CLI does that and passes plain values
in. Every parser raises :class:`ConfigError` with a one-line message that never
contains a password. One module per concern, every name importable from here:

- :mod:`.settings`: the relay loop's tunables (``RelaySettings``), their defaults and checks, durations;
- :mod:`.tables`: the outbox table's name (``TableName``) and layout (``TableLayout``, Debezium's);
- :mod:`.sink_urls`: sink URLs parsed into ``KafkaSinkConfig`` / ``AmqpSinkConfig``, and message formats;
- :mod:`.routes`: ``--route PATTERN=URL`` and ``--sink`` as routes;
- :mod:`.database`: the database URL's checks;
- :mod:`.event_source`: the CloudEvents ``source``, by default and as ``--event-source`` gives it.
"""

from __future__ import annotations

from relay.config.database import MYSQL_SCHEMES, check_database_url, is_mysql_url
from relay.config.event_source import (
    EVENT_SOURCE_MAX_CHARS,
    EVENT_SOURCE_PREFIX,
    check_event_source,
    default_event_source,
)
from relay.config.routes import RouteConfig, parse_route, resolve_routes, split_routes
from relay.config.settings import (
    BACKOFF_INITIAL_SECONDS,
    BACKOFF_MAX_SECONDS,
    BATCH_BYTES,
    BATCH_SIZE,
    CLAIM_RESERVE_SECONDS,
    CONNECT_TIMEOUT_SECONDS,
    DEFAULT_METRICS_HOST,
    LEASE_SECONDS,
    MAX_ATTEMPTS,
    MAX_DURATION_SECONDS,
    MIN_PUBLISH_TIMEOUT_SECONDS,
    PIPELINE_DEPTH,
    POLL_INTERVAL_MAX_SECONDS,
    POLL_INTERVAL_SECONDS,
    PUBLISH_TIMEOUT_SECONDS,
    SETTLE_RESERVE_SECONDS,
    RelaySettings,
    parse_duration,
)
from relay.config.sink_urls import (
    AMQP_SHORTSTR_MAX_BYTES,
    DECLARE_OPTION,
    EXCHANGE_TYPES,
    FORMAT_OPTION,
    AmqpSinkConfig,
    Format,
    KafkaSinkConfig,
    SinkConfig,
    parse_amqp_url,
    parse_format,
    parse_kafka_url,
    parse_sink_url,
)
from relay.config.tables import (
    DEBEZIUM_RESERVED_HEADERS,
    DEFAULT_TABLE,
    DEFAULT_TOPIC_TEMPLATE,
    MAX_IDENTIFIER_CHARS,
    MAX_TABLE_NAME_CHARS,
    NATIVE,
    TABLE_LAYOUTS,
    TableLayout,
    TableName,
)

# What is secret is decided in relay.secrets; these two stay importable from here.
from relay.secrets import is_secret_option, redact_url

__all__ = [
    "AMQP_SHORTSTR_MAX_BYTES",
    "BACKOFF_INITIAL_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "BATCH_BYTES",
    "BATCH_SIZE",
    "CLAIM_RESERVE_SECONDS",
    "CONNECT_TIMEOUT_SECONDS",
    "DEBEZIUM_RESERVED_HEADERS",
    "DECLARE_OPTION",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_TABLE",
    "DEFAULT_TOPIC_TEMPLATE",
    "EVENT_SOURCE_MAX_CHARS",
    "EVENT_SOURCE_PREFIX",
    "EXCHANGE_TYPES",
    "FORMAT_OPTION",
    "LEASE_SECONDS",
    "MAX_ATTEMPTS",
    "MAX_DURATION_SECONDS",
    "MAX_IDENTIFIER_CHARS",
    "MAX_TABLE_NAME_CHARS",
    "MIN_PUBLISH_TIMEOUT_SECONDS",
    "MYSQL_SCHEMES",
    "NATIVE",
    "PIPELINE_DEPTH",
    "POLL_INTERVAL_MAX_SECONDS",
    "POLL_INTERVAL_SECONDS",
    "PUBLISH_TIMEOUT_SECONDS",
    "SETTLE_RESERVE_SECONDS",
    "TABLE_LAYOUTS",
    "AmqpSinkConfig",
    "Format",
    "KafkaSinkConfig",
    "RelaySettings",
    "RouteConfig",
    "SinkConfig",
    "TableLayout",
    "TableName",
    "check_database_url",
    "check_event_source",
    "default_event_source",
    "is_mysql_url",
    "is_secret_option",
    "parse_amqp_url",
    "parse_duration",
    "parse_format",
    "parse_kafka_url",
    "parse_route",
    "parse_sink_url",
    "redact_url",
    "resolve_routes",
    "split_routes",
]
