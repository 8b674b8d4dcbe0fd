"""The sink URL option ``format=`` and the CloudEvents ``source``: parsed once, no secret in them."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from psycopg.conninfo import conninfo_to_dict

from relay.app import RunConfig
from relay.config import (
    AmqpSinkConfig,
    Format,
    KafkaSinkConfig,
    RelaySettings,
    TableName,
    check_event_source,
    default_event_source,
    parse_route,
    parse_sink_url,
)
from relay.errors import ConfigError
from relay.sinks import build_router
from relay.sinks.kafka import producer_config

OUTBOX = TableName.parse("outbox")
DSN = "postgresql://app@db/shop"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", Format.NATIVE),
        ("?format=native", Format.NATIVE),
        ("?format=cloudevents", Format.CLOUDEVENTS),
        ("?linger.ms=2&format=cloudevents-structured", Format.CLOUDEVENTS_STRUCTURED),
    ],
)
def test_kafka_format_is_taken_out_before_librdkafka_sees_the_options(query: str, expected: Format) -> None:
    cfg = parse_sink_url(f"kafka://k:9092{query}")
    assert isinstance(cfg, KafkaSinkConfig)
    assert cfg.format is expected
    assert "format" not in cfg.options
    settings = producer_config(cfg, publish_timeout_seconds=30, client_id="t")
    assert "format" not in settings
    assert f"format={expected.value!r}" in repr(cfg)


def test_amqp_format_is_taken_out_of_pikas_url() -> None:
    cfg = parse_sink_url("amqp://u:pw@r:5672/v?format=cloudevents-structured&exchange=ev&heartbeat=5")
    assert isinstance(cfg, AmqpSinkConfig)
    assert cfg.format is Format.CLOUDEVENTS_STRUCTURED
    assert cfg.exchange == "ev"
    assert "format" not in cfg.url
    assert cfg.url.endswith("?heartbeat=5")
    assert parse_sink_url("amqp://r/").format is Format.NATIVE


@pytest.mark.parametrize(
    "url", ["kafka://k:9092?format=json", "amqp://u:pw@r/?format=CloudEvents", "kafka://k:9092?format="]
)
def test_an_unknown_format_names_the_allowed_ones(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_sink_url(url)
    message = str(caught.value)
    assert "format=" in message
    assert "native, cloudevents, cloudevents-structured" in message
    assert "pw" not in message


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("kafka://k:9092?format=cloudevents&format=native", "format"),
        ("kafka://k:9092?format=native&linger.ms=2&format=native", "format"),  # even the same value
        ("kafka://k:9092?linger.ms=2&linger.ms=5", "linger.ms"),
        ("kafka://k:9092?linger_ms=2&linger.ms=5", "linger.ms"),  # one option under two spellings
        ("kafka://k:9092?compression.type=lz4&compression_type=zstd", "compression.type"),
        ("kafka://user:pw@k:9092?sasl.username=other", "sasl.username"),  # a user in the URL is that option
        ("kafka://user:pw@k:9092?sasl_password=hunter2", "sasl.password"),
        ("amqp://u:pw@r/?format=cloudevents&format=native", "format"),
        ("amqp://u:pw@r/?exchange=a&exchange=b", "exchange"),
        ("amqp://u:pw@r/?exchange=&format=native&exchange=", "exchange"),
        ("amqp://u:pw@r/?heartbeat=5&exchange=ev&heartbeat=10", "heartbeat"),
        ("amqps://u:pw@r/?connection_attempts=2&connection_attempts=3", "connection_attempts"),
    ],
)
def test_an_option_given_twice_is_refused_in_one_line(url: str, named: str) -> None:
    # Last-wins would hide an edit that left the old value behind (the wrong exchange or format).
    with pytest.raises(ConfigError) as caught:
        parse_sink_url(url)
    message = str(caught.value)
    assert f"sink option {named!r} is given twice" in message
    assert "\n" not in message
    assert "pw" not in message and "hunter2" not in message
    with pytest.raises(ConfigError, match="given twice"):
        parse_route(f"orders.*={url}")


def test_a_bad_format_in_a_route_names_the_route() -> None:
    with pytest.raises(ConfigError, match=r"route 'billing\.\*': invalid sink option format='json'"):
        parse_route("billing.*=kafka://k:9092?format=json")


def test_routes_with_other_formats_get_sinks_of_their_own() -> None:
    routes = [
        parse_route("ce.*=kafka://k:9092?format=cloudevents"),
        parse_route("st.*=kafka://k:9092?format=cloudevents-structured"),
        parse_route("*=kafka://k:9092"),
    ]
    router = build_router(routes, publish_timeout_seconds=5, event_source="/s")
    sinks = {id(target.sink) for target in router._targets}
    assert len(sinks) == 3
    assert {target.sink._config.format for target in router._targets} == set(Format)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://app:s3cret-pw@db.internal:5432/shop", "/outbox-relay/shop/outbox"),
        ("postgresql://app@db/shop?sslmode=require&password=s3cret-pw", "/outbox-relay/shop/outbox"),
        ("postgresql://db.internal/?dbname=sales", "/outbox-relay/sales/outbox"),
        ("host=db.internal user=app password=s3cret-pw dbname=shop", "/outbox-relay/shop/outbox"),
        ("host=db dbname='my shop' password='a b'", "/outbox-relay/my%20shop/outbox"),
        ("postgresql://app:pw@db/", "/outbox-relay/outbox"),
        ("host=db user=app", "/outbox-relay/outbox"),
        ("postgresql://app@db/caf%C3%A9/x", "/outbox-relay/caf%C3%A9%2Fx/outbox"),
    ],
)
def test_the_default_source_names_the_database_and_table_only(dsn: str, expected: str) -> None:
    source = default_event_source(dsn, OUTBOX)
    assert source == expected
    for secret in ("s3cret", "app", "db.internal", "a b"):
        assert secret not in source


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db dbname=my\\ shop",  # an escaped space, as libpq takes it unquoted
        "host=db dbname=it\\'s",
        "host=db dbname = 'it\\'s'",
        "host=db password='x dbname=evil' dbname=shop",  # no dbname= inside another value
        "host=db application_name='x dbname=evil'",  # none at all
        "dbname=first host=db dbname=second",  # the last one wins
        "postgresql://db/?dbname=a+b",  # '+' is no space in a URI
        "postgresql://db/a+b",
        "postgresql://db/x?dbname=y&dbname=z",
    ],
)
def test_the_default_source_names_the_database_libpq_connects_to(dsn: str) -> None:
    database = conninfo_to_dict(dsn).get("dbname")  # libpq's own reading
    expected = (
        f"/outbox-relay/{quote(database, safe='')}/outbox" if isinstance(database, str) else "/outbox-relay/outbox"
    )
    assert default_event_source(dsn, OUTBOX) == expected


def test_the_default_source_masks_a_database_named_like_its_password() -> None:
    source = default_event_source("postgresql://app:hunter2hunter2@db/hunter2hunter2", TableName.parse("ev.outbox"))
    assert "hunter2" not in source
    assert source == "/outbox-relay/***/ev.outbox"
    # Even a password cut by a parser that misread a raw '/' in it leaves no piece behind.
    broken = default_event_source("postgresql://app:pa/ss@wordy@db/shop", OUTBOX)
    assert "ss@wordy" not in broken and "wordy" not in broken


@pytest.mark.parametrize(
    "text",
    [
        "/shop/orders",
        "urn:shop:orders",
        "https://shop.example/orders",
        "orders",
        "https://[::1]:8080/orders",
        "/a%7Bb%7D?x=1#f",
        "//host/path",
    ],
)
def test_event_sources_that_are_uri_references(text: str) -> None:
    assert check_event_source(text) == text


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("/shop orders", "without spaces"),
        ("/shop\x00", "control characters"),
        ("https://app:s3cret@shop.example/orders", "user or password"),
        ("https://app@shop.example/orders", "user or password"),
        ("//app:s3cret@shop.example/orders", "user or password"),  # a network-path reference has an authority too
        ("http://[bad", "not a URI-reference"),
        ("http://[::1/x", "not a URI-reference"),
        ("http://host:port/x", "not a URI-reference"),
        ("/a{b}", "not a URI-reference"),
        ("/a<b>", "not a URI-reference"),
        ('/say"hi"', "not a URI-reference"),
        ("/a|b", "not a URI-reference"),
        ("/a\\b", "not a URI-reference"),
        ("/a^b", "not a URI-reference"),
        ("/a`b", "not a URI-reference"),
    ],
)
def test_bad_event_sources_are_refused_without_the_password(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as caught:
        check_event_source(text)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "/shop?password=s3cret",
        "/shop?sig=s3cret",
        "https://store.example/c?sv=2022&sig=s3cret",
        "https://s3.example/b?X-Amz-Signature=s3cret",
        "urn:shop?token=s3cret",
        "//shop.example/o?access_token=s3cret",
        "/shop?apikey=s3cret",
        "/shop?key=s3cret",
        "/shop?client_secret=s3cret",
        "/shop?pass%77ord=s3cret",  # a percent-encoded name
        "/shop?%73ig=s3cret",
        "/shop?passwords3cret",  # an option glued to its value
        "https://s3cret@shop.example/orders",  # a token alone
        "//s3cret@shop.example/orders",
        "kafka://s3cret@broker:9092",
    ],
)
def test_an_event_source_holding_a_secret_is_refused_without_it(text: str) -> None:
    """Every form relay.secrets masks, not only user:pass@: the source goes out with every event."""
    with pytest.raises(ConfigError, match="--event-source") as caught:
        check_event_source(text)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(
    "text", ["mailto:ops@shop.example", "/shop?design=2", "/shop?v=1&format=json", "https://shop.example/o?region=eu"]
)
def test_an_event_source_without_a_secret_is_taken(text: str) -> None:
    assert check_event_source(text) == text


def test_run_config_takes_the_flag_or_the_default() -> None:
    sink = parse_sink_url("kafka://k:9092?format=cloudevents")
    dsn = "postgresql://app:s3cret@db/shop"
    assert RunConfig(dsn, OUTBOX, sink, RelaySettings()).source == "/outbox-relay/shop/outbox"
    given = RunConfig(dsn, OUTBOX, sink, RelaySettings(), event_source="urn:shop")
    assert given.source == "urn:shop"
    assert given.describe_sinks() == "kafka (cloudevents)"
    with pytest.raises(ConfigError, match="user or password"):
        RunConfig(dsn, OUTBOX, sink, RelaySettings(), event_source="https://a:s3cret@h/x")


@pytest.mark.parametrize(
    ("sink", "routes"),
    [
        ("kafka://k:9092", ()),
        ("amqp://r/?format=native", ()),
        (None, ("a.*=kafka://k:9092", "*=amqp://r/")),
        (None, ("a.*=kafka://k:9092?format=native",)),
    ],
)
def test_an_event_source_no_sink_uses_is_refused(sink: str | None, routes: tuple[str, ...]) -> None:
    parsed = tuple(parse_route(route) for route in routes)
    with pytest.raises(ConfigError, match="no sink has format=cloudevents"):
        RunConfig(
            DSN, OUTBOX, parse_sink_url(sink) if sink else None, RelaySettings(), routes=parsed, event_source="urn:x"
        )
    # Without the flag the same sinks are fine.
    RunConfig(DSN, OUTBOX, parse_sink_url(sink) if sink else None, RelaySettings(), routes=parsed)


@pytest.mark.parametrize(
    "routes",
    [("a.*=kafka://k:9092?format=cloudevents", "*=amqp://r/"), ("*=amqp://r/?format=cloudevents-structured",)],
)
def test_an_event_source_one_route_uses_is_taken(routes: tuple[str, ...]) -> None:
    parsed = tuple(parse_route(route) for route in routes)
    assert RunConfig(DSN, OUTBOX, None, RelaySettings(), routes=parsed, event_source="urn:x").source == "urn:x"


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("http://u:p\u00e4/ss@[bad/x", ["p\u00e4", "ss@"]),
        ("https://u:s3cr/et@host/x", ["s3cr", "et@"]),
        ("https://u:s3c?ret@host:port/x", ["s3c", "ret@"]),
        ("https://u:s3c#ret@host/x", ["s3c", "ret@"]),
        ("http://u:s3cr3t/x@h:port/x", ["s3cr3t"]),
        ("//u:s3cr/et@host/x", ["s3cr", "et@"]),
        ("//u:s3c#ret@host/x", ["s3c", "ret@"]),
    ],
)
def test_an_event_source_whose_password_a_raw_character_cuts_is_refused_without_a_piece(
    text: str, pieces: list[str]
) -> None:
    with pytest.raises(ConfigError, match="percent-encode") as caught:
        check_event_source(text)
    assert not [piece for piece in pieces if piece in str(caught.value)], str(caught.value)
