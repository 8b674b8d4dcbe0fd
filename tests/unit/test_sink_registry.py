"""One registration per sink kind (relay.sinks.registry): every question about a kind goes to it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from relay.config import AmqpSinkConfig, Format, KafkaSinkConfig, parse_sink_url
from relay.errors import ConfigError
from relay.sinks import build_sink, header_refusal, publish_grace_seconds, sink_kind_name
from relay.sinks.registry import SINK_KINDS, SinkKind
from tests.conformance.sink_harness import THROWAWAY, ThrowawayConfig, ThrowawaySink


@pytest.fixture
def throwaway() -> Iterator[SinkKind]:
    SINK_KINDS.register(THROWAWAY)
    try:
        yield THROWAWAY
    finally:
        SINK_KINDS.unregister(THROWAWAY.name)


@dataclass(frozen=True)
class Unregistered:
    format: Format = Format.NATIVE


def test_a_registered_kind_is_parsed_built_and_asked_through_its_registration(throwaway: SinkKind) -> None:
    config = parse_sink_url("THROWAWAY://somewhere")
    assert config == ThrowawayConfig("somewhere")
    assert isinstance(build_sink(config, publish_timeout_seconds=1.0), ThrowawaySink)
    assert publish_grace_seconds(config) == 0.5
    assert sink_kind_name(config) == "throwaway"
    assert header_refusal(config, "x-trace") == "no x- headers"
    assert header_refusal(config, "trace") is None


@pytest.mark.parametrize("config", [Unregistered(), Unregistered(Format.CLOUDEVENTS), ThrowawayConfig("off")])
def test_a_kind_not_registered_fails_loudly_and_never_takes_another_kinds_settings(config: object) -> None:
    # Before: the lease grace of any sink but Kafka was RabbitMQ's, and build_sink raised a bare TypeError.
    for ask in (
        lambda: publish_grace_seconds(config),  # type: ignore[arg-type]
        lambda: sink_kind_name(config),  # type: ignore[arg-type]
        lambda: header_refusal(config, "h"),  # type: ignore[arg-type]
        lambda: build_sink(config, publish_timeout_seconds=1.0),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError, match=f"no sink kind is registered for {type(config).__name__}"):
            ask()


@pytest.mark.parametrize("url", ["nats://host:4222", "throwaway://x", "Kafkas://h:1", "http://u:p@h/"])
def test_an_unknown_scheme_names_the_registered_ones(url: str) -> None:
    with pytest.raises(ConfigError, match=r"unknown sink scheme .*: use kafka:// or amqp:// or amqps://$") as info:
        parse_sink_url(url)
    assert ":p@" not in str(info.value)


def test_the_shipped_kinds_answer_as_before() -> None:
    kafka, amqp = KafkaSinkConfig("h:9092"), AmqpSinkConfig("amqp://guest:guest@h/")
    assert (sink_kind_name(kafka), sink_kind_name(amqp)) == ("kafka", "amqp")
    assert (publish_grace_seconds(kafka), publish_grace_seconds(amqp)) == (5.0, 10.0)
    assert header_refusal(amqp, "x-" + "h" * 300) is not None and header_refusal(kafka, "x-" + "h" * 300) is None
    # CloudEvents: each kind gives way to its own binding's headers only.
    ce_kafka, ce_amqp = (
        KafkaSinkConfig("h:9092", format=Format.CLOUDEVENTS),
        AmqpSinkConfig("amqp://h/", format=Format.CLOUDEVENTS),
    )
    assert header_refusal(ce_kafka, "ce_id") is not None and header_refusal(ce_amqp, "ce_id") is None
    assert header_refusal(ce_amqp, "cloudEvents:id") is not None and header_refusal(ce_kafka, "cloudEvents:id") is None


def test_a_scheme_or_name_taken_cannot_be_registered_again(throwaway: SinkKind) -> None:
    for clash in (throwaway, replace(throwaway, name="other"), replace(throwaway, name="x", schemes=("amqps",))):
        with pytest.raises(ValueError, match="clashes"):
            SINK_KINDS.register(clash)


def test_a_sink_that_contradicts_its_registration_on_chaining_keys_is_not_built(throwaway: SinkKind) -> None:
    SINK_KINDS.unregister(throwaway.name)
    SINK_KINDS.register(replace(throwaway, chains_keys=False))
    with pytest.raises(TypeError, match="chains_keys"):
        build_sink(parse_sink_url("throwaway://x"), publish_timeout_seconds=1.0)
