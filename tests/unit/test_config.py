"""Configuration parsing: clear errors, no secrets."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from relay.backoff import Backoff
from relay.config import (
    AmqpSinkConfig,
    KafkaSinkConfig,
    RelaySettings,
    TableLayout,
    TableName,
    check_database_url,
    parse_sink_url,
    redact_url,
)
from relay.errors import ConfigError
from relay.logs import ScrubSecrets


@pytest.mark.parametrize("text", ["outbox", "events.outbox", "_o1", "A.b_2", "t" * 45, "s" * 63 + "." + "t" * 45])
def test_valid_table_names(text: str) -> None:
    assert str(TableName.parse(text)) == text


@pytest.mark.parametrize(
    "text",
    [
        "t" * 46,
        "t" * 63,
        "t" * 64,
        "t" * 200,
        "events." + "t" * 50,
        "events." + "t" * 64,
        "u" * 30 + "_idempotency_key",
    ],
)
def test_names_too_long_for_distinct_index_and_constraint_names_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid table name .*at most 45 characters after the schema"):
        TableName.parse(text)


@pytest.mark.parametrize("text", ["s" * 64 + ".outbox", "s" * 100 + "." + "t" * 100])
def test_a_schema_name_too_long_is_told_so(text: str) -> None:
    with pytest.raises(ConfigError, match=r"invalid table name .*a schema name has at most 63 characters"):
        TableName.parse(text)


def test_the_longest_table_name_gives_distinct_derived_names_on_both_databases() -> None:
    from relay.store import sql as postgres_sql
    from relay.store.mysql import sql as mysql_sql

    table = TableName.parse("t" * 45)
    # A PostgreSQL trigger's name is its table's own, apart from the schema's: it may be its function's.
    # MySQL's triggers are the schema's, as every other name here.
    postgres_triggers = ("notify_trigger", "writer_bounds_trigger")
    for identifiers, own in ((postgres_sql.identifiers(table), postgres_triggers), (mysql_sql.identifiers(table), ())):
        names = [str(value) for name, value in identifiers.items() if name != "table" and name not in own]
        assert len(set(names)) == len(names), names


@pytest.mark.parametrize(
    "text", ['outbox"; drop table t;--', "a.b.c", "1abc", "", "out box", "x" * 64, "a-b", "outbox;"]
)
def test_invalid_table_names_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="invalid table name"):
        TableName.parse(text)


def test_kafka_url_with_hosts_and_options() -> None:
    cfg = parse_sink_url("kafka://u:s3cret@a:9092,b:9093?security_protocol=SASL_SSL&sasl.mechanism=PLAIN")
    assert isinstance(cfg, KafkaSinkConfig)
    assert cfg.bootstrap_servers == "a:9092,b:9093"
    assert cfg.options["security.protocol"] == "SASL_SSL"
    assert cfg.options["sasl.password"] == "s3cret"
    assert "s3cret" not in repr(cfg)


def test_amqp_url_takes_the_exchange_out_and_hides_the_password() -> None:
    cfg = parse_sink_url("amqp://guest:s3cret@h:5672/%2F?exchange=events&heartbeat=10")
    assert isinstance(cfg, AmqpSinkConfig)
    assert cfg.exchange == "events"
    assert "exchange" not in cfg.url and "heartbeat=10" in cfg.url
    assert "s3cret" not in repr(cfg)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("", "no sink configured"),
        ("redis://h:1", "unknown sink scheme"),
        ("kafka://", "names no broker"),
        ("kafka://host", "is not host:port"),
        ("kafka://h:99999", "is not host:port"),
        ("amqp://:s3cret@/", "names no host"),
        ("amqp://u:s3cret@h:notaport/", "invalid sink URL"),
    ],
)
def test_bad_sink_urls(url: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        parse_sink_url(url)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("url", "what"),
    [
        ("amqp://u:s3cret@h/%2F?exchange=" + "x" * 256, "exchange"),
        ("amqp://u:s3cret@h/%2F?exchange=" + "%C3%A9" * 128, "exchange"),
        ("amqps://u:s3cret@h/" + "v" * 256, "vhost"),
        ("amqp://u:s3cret@h/" + "%F0%9F%90%87" * 64, "vhost"),
    ],
)
def test_amqp_names_longer_than_a_short_string_are_refused(url: str, what: str) -> None:
    with pytest.raises(ConfigError, match=f"the {what} name in amqp sink URL .* 2[56][0-9] bytes of UTF-8") as info:
        parse_sink_url(url)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["amqp://u:p@h/%2F?exchange=" + "x" * 255, "amqp://u:p@h/" + "v" * 255, "amqp://u:p@h", "amqp://u:p@h/"],
)
def test_amqp_names_that_fit_a_short_string_are_taken(url: str) -> None:
    assert isinstance(parse_sink_url(url), AmqpSinkConfig)


def test_database_url_checks() -> None:
    assert check_database_url("postgresql://a@h/db")
    assert check_database_url("mysql://u:s3cret@h:3306/db")
    assert check_database_url("mariadb://u:s3cret@h/db")
    with pytest.raises(ConfigError, match="no database"):
        check_database_url("")
    with pytest.raises(ConfigError, match="unknown database URL scheme") as info:
        check_database_url("mssql://u:s3cret@h/db")
    assert "s3cret" not in str(info.value)


def test_redact_url() -> None:
    assert redact_url("postgresql://app:pw@h:5432/db?sslpassword=x") == "postgresql://app:***@h:5432/db?sslpassword=***"
    assert redact_url("amqp://guest@h/") == "amqp://guest@h/"


def test_settings_validation() -> None:
    with pytest.raises(ConfigError, match="lease"):  # checked where the sinks are known (test_lease.py)
        RelaySettings(lease_seconds=5, publish_timeout_seconds=10).check_lease()
    with pytest.raises(ConfigError, match="backoff-max"):
        RelaySettings(backoff_initial_seconds=5, backoff_max_seconds=1)


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    backoff = Backoff(1.0, 60.0)
    delays = [backoff.delay(n) for n in range(1, 10)]
    assert 1.0 <= delays[0] <= 2.0
    assert 8.0 <= delays[3] <= 9.0
    assert max(delays) == 60.0
    assert len({Backoff(1.0, 60.0).delay(3) for _ in range(20)}) > 1


def test_log_scrubbing_removes_secrets_from_messages_and_tracebacks() -> None:
    record = logging.LogRecord("x", logging.INFO, "", 0, "connecting to %s", ("amqp://u:hunter2@h",), None)
    try:
        raise ValueError("bad hunter2")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    ScrubSecrets(["hunter2"]).filter(record)
    assert "hunter2" not in record.getMessage()
    assert record.exc_text and "hunter2" not in record.exc_text and "***" in record.exc_text


def test_table_layouts_and_their_options() -> None:
    assert TableLayout.parse("native") == TableLayout()
    debezium = TableLayout.parse("debezium", topic_template="events.{aggregatetype}", field_headers=["type=eventType"])
    assert (debezium.debezium, debezium.topic_template, debezium.field_headers) == (
        True,
        "events.{aggregatetype}",
        (("type", "eventType"),),
    )
    assert TableLayout.parse("debezium").topic_template == "outbox.event.{aggregatetype}"
    assert str(debezium.relation(TableName.parse("app.outboxevent"))) == "app.outboxevent_relay"
    assert TableLayout().relation(TableName.parse("outbox")) == TableName.parse("outbox")


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("cdc", {}, "unknown table layout"),
        ("native", {"topic_template": "x.{aggregatetype}"}, "go with --table-layout debezium"),
        ("native", {"field_headers": ["type=t"]}, "go with --table-layout debezium"),
        ("debezium", {"topic_template": "a b"}, "invalid topic template"),
        ("debezium", {"topic_template": "x.{type}"}, "invalid topic template"),  # one placeholder only
        ("debezium", {"field_headers": ["type"]}, "invalid field header"),
        ("debezium", {"field_headers": ["ty pe=x"]}, "invalid field header"),
        # The headers every record carries from the row itself: a column standing in would replace them.
        ("debezium", {"field_headers": ["type=id"]}, "is the relay's own"),
        ("debezium", {"field_headers": ["type=ID"]}, "is the relay's own"),
        ("debezium", {"field_headers": ["aggregateid=idempotency-key"]}, "is the relay's own"),
        ("debezium", {"field_headers": ["type=eventType", "tenant=Idempotency-Key"]}, "is the relay's own"),
    ],
)
def test_bad_table_layouts_are_refused(name: str, options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        TableLayout.parse(name, **options)


@pytest.mark.parametrize(
    ("flags", "first", "longest"),
    [
        ([], 0.5, 5.0),
        (["--poll-interval-max", "0.1"], 0.1, 0.1),  # below the first wait: it caps it (docs/mysql.md)
        (["--poll-interval", "2", "--poll-interval-max", "1"], 1.0, 1.0),
        (["--poll-interval", "0.2", "--poll-interval-max", "3"], 0.2, 3.0),
    ],
)
def test_the_longest_poll_wait_caps_the_first(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], first: float, longest: float
) -> None:
    import relay.app
    from relay.cli import build_parser
    from relay.cli.commands import cmd_run

    seen: list[Any] = []

    async def capture(config: Any) -> None:
        seen.append(config.settings)

    monkeypatch.setattr(relay.app, "serve", capture)
    args = build_parser().parse_args(["run", "--database-url", "postgresql://h/db", "--sink", "kafka://h:1", *flags])
    assert cmd_run(args) == 0
    [settings] = seen
    assert (settings.poll_interval_seconds, settings.poll_interval_max_seconds) == (first, longest)
