"""Kafka URL options that would change partitioning, order or what a delivery report means are refused."""

from __future__ import annotations

from urllib.parse import quote

import confluent_kafka
import pytest

from relay.config import KafkaSinkConfig, parse_route, parse_sink_url
from relay.errors import ConfigError
from relay.kafka_options import ALLOWED, DECIMAL_OPTIONS, INTEGER_OPTIONS, REQUIRED_VALUES
from relay.sinks.kafka import producer_config

#: (option=value, what the one-line error names). Each changes how keys map to
#: partitions, the order of a key's messages, or what a delivery report means;
#: or it is no producer option at all.
REFUSED = [
    ("partitioner=random", "partitioner"),
    ("partitioner=murmur2_random", "partitioner"),
    ("partitioner_cb=x", "partitioner_cb"),
    ("max.in.flight.requests.per.connection=5", "max.in.flight.requests.per.connection"),
    ("max.in.flight=1", "max.in.flight"),
    ("max_in_flight_requests_per_connection=10", "max.in.flight.requests.per.connection"),
    ("enable.idempotence=false", "enable.idempotence"),
    ("enable_idempotence=0", "enable.idempotence"),
    ("retries=3", "retries"),
    ("message.send.max.retries=0", "message.send.max.retries"),
    ("enable.gapless.guarantee=true", "enable.gapless.guarantee"),
    ("queuing.strategy=lifo", "queuing.strategy"),
    ("transactional.id=relay", "transactional.id"),
    ("transaction.timeout.ms=60000", "transaction.timeout.ms"),
    ("acks=1", "acks"),
    ("acks=0", "acks"),
    ("request.required.acks=1", "request.required.acks"),
    ("message.timeout.ms=0", "message.timeout.ms"),
    ("message_timeout_ms=0", "message.timeout.ms"),
    ("delivery.timeout.ms=600000", "delivery.timeout.ms"),
    ("topic.metadata.propagation.max.ms=0", "topic.metadata.propagation.max.ms"),
    ("delivery.report.only.error=true", "delivery.report.only.error"),
    ("dr_msg_cb=x", "dr_msg_cb"),
    ("on_delivery=x", "on_delivery"),
    ("topic.blacklist=.*", "topic.blacklist"),
    ("plugin.library.paths=monitoring-interceptor", "plugin.library.paths"),
    ("api.version.request=false", "api.version.request"),
    ("broker.version.fallback=0.9.0", "broker.version.fallback"),
    ("socket.max.fails=3", "socket.max.fails"),
    ("bootstrap.servers=other:9092", "bootstrap.servers"),
    ("error_cb=x", "error_cb"),
    ("group.id=relay", "consumer option"),
    ("auto.offset.reset=earliest", "consumer option"),
    ("linger.msx=5", "unknown kafka option"),
]
#: Options that change none of that: tuning, TLS and SASL, client identity, logging.
ACCEPTED = [
    "linger.ms=20",
    "queue.buffering.max.ms=20",
    "batch.size=65536",
    "batch.num.messages=500",
    "compression.type=lz4",
    "compression_codec=zstd",
    "client.id=billing-relay",
    "client.rack=eu-1a",
    "acks=all",
    "acks=-1",
    "enable.idempotence=true",
    "security.protocol=sasl_ssl",
    "sasl.mechanism=SCRAM-SHA-512",
    "ssl.ca.location=/etc/ssl/ca.pem",
    "sasl.oauthbearer.client.secret=s3cret",
    "ssl_key_pem=key",
    "socket.keepalive.enable=true",
    "request.timeout.ms=20000",
    "retry.backoff.ms=200",
    "message.max.bytes=2000000",
    "sticky.partitioning.linger.ms=0",
    "allow.auto.create.topics=false",
    "log_level=6",
    "debug=broker,topic",
]


@pytest.mark.parametrize(("option", "named"), REFUSED, ids=[option for option, _ in REFUSED])
def test_an_option_that_weakens_the_guarantees_is_a_config_error(option: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_sink_url(f"kafka://broker:9092?linger.ms=5&{option}")
    message = str(caught.value)
    assert named in message and "\n" not in message, message
    with pytest.raises(ConfigError):
        parse_route(f"billing.*=kafka://broker:9092?{option}")


@pytest.mark.parametrize(("option", "named"), REFUSED, ids=[option for option, _ in REFUSED])
def test_the_producer_settings_refuse_them_too(option: str, named: str) -> None:
    name, _, value = option.partition("=")
    with pytest.raises(ConfigError):
        producer_config(KafkaSinkConfig("b:9092", {name: value}), publish_timeout_seconds=30, client_id="r")


@pytest.mark.parametrize("option", ACCEPTED)
def test_an_option_that_keeps_the_guarantees_is_accepted(option: str) -> None:
    config = parse_sink_url(f"kafka://broker:9092?{option}")
    assert isinstance(config, KafkaSinkConfig)
    settings = producer_config(config, publish_timeout_seconds=30, client_id="r")
    assert settings["partitioner"] == "murmur2_random" and settings["message.timeout.ms"] == 0
    assert str(settings["acks"]) in ("all", "-1") and str(settings["enable.idempotence"]).lower() in ("true", "1")


def test_options_are_passed_to_librdkafka_under_its_own_names() -> None:
    config = parse_sink_url("kafka://broker:9092?log_level=6&compression_type=lz4&ssl_key_pem=k")
    assert isinstance(config, KafkaSinkConfig)
    assert config.options == {"log_level": "6", "compression.type": "lz4", "ssl.key.pem": "k"}


@pytest.mark.parametrize("option", ["linger.ms=30000", "queue.buffering.max.ms=45000", "linger.ms=soon"])
def test_a_linger_as_long_as_the_publish_timeout_is_refused(option: str) -> None:
    config = parse_sink_url(f"kafka://broker:9092?{option}")
    assert isinstance(config, KafkaSinkConfig)
    with pytest.raises(ConfigError, match=r"linger\.ms"):
        producer_config(config, publish_timeout_seconds=30, client_id="r")


#: Numbers librdkafka reads only in part (strtol/strtod stop at the first other character, and
#: whole numbers wrap at 32 bits): each ran with another value than the one written, or with 0.
PARTLY_READ_WHOLE = [
    "1_000",
    "1.9",
    "1e6",
    "0x10",
    "5abc",
    "abc",
    "",
    "\u0661\u0660",
    str(2**32 + 1),
    str(-(2**31) - 1),
]
PARTLY_READ_DECIMAL = ["1_000", "1_0.5", "\u0661\u0660", "\uff15"]


@pytest.mark.parametrize("value", PARTLY_READ_WHOLE)
@pytest.mark.parametrize(
    "option", ["batch.size", "batch_num_messages", "compression.level", "statistics.interval.ms", "socket.timeout.ms"]
)
def test_a_whole_number_option_librdkafka_would_read_in_part_is_refused(option: str, value: str) -> None:
    with pytest.raises(ConfigError, match="is not a whole number in ASCII digits"):
        parse_sink_url(f"kafka://broker:9092?{option}={quote(value)}")


@pytest.mark.parametrize("value", PARTLY_READ_DECIMAL)
@pytest.mark.parametrize("option", ["linger.ms", "queue.buffering.max.ms"])
def test_a_decimal_option_librdkafka_would_read_in_part_is_refused(option: str, value: str) -> None:
    with pytest.raises(ConfigError, match="is not a number in ASCII digits"):
        parse_sink_url(f"kafka://broker:9092?{option}={quote(value)}")


WHOLE_READS = [("batch.size", "16384"), ("batch.size", "+5"), ("compression.level", "-1"), ("linger.ms", "2.5"),
               ("batch.size", str(2**31 - 1)), ("linger.ms", "1e3"), ("queue.buffering.max.ms", "0")]  # fmt: skip


@pytest.mark.parametrize(("option", "value"), WHOLE_READS)
def test_a_number_librdkafka_reads_whole_is_taken(option: str, value: str) -> None:
    config = parse_sink_url(f"kafka://broker:9092?{option}={quote(value)}")
    assert isinstance(config, KafkaSinkConfig) and config.options[option] == value


def test_the_whole_and_decimal_options_are_the_ones_librdkafka_reads_as_numbers() -> None:
    """librdkafka says which options are numbers: a value far out of range is refused with its range."""
    numbers = set()
    for option in sorted(ALLOWED):
        try:
            confluent_kafka.Producer({option: "-99999999999"})
        except confluent_kafka.KafkaException as exc:
            if "is outside allowed range" in str(exc):
                numbers.add(option)
    assert numbers - set(REQUIRED_VALUES) == INTEGER_OPTIONS | DECIMAL_OPTIONS
