"""The ``declare=`` option of an amqp sink URL: parsed, checked, and never confused with pika's options."""

from __future__ import annotations

import pytest

from relay.config import AmqpSinkConfig, parse_sink_url
from relay.errors import ConfigError

BASE = "amqp://app:s3cret-pw@rabbit:5672/%2F"


@pytest.mark.parametrize("exchange_type", ["topic", "direct", "fanout", "headers"])
@pytest.mark.parametrize("order", ["exchange first", "declare first"])
def test_declare_names_the_exchange_type_and_is_not_passed_to_pika(exchange_type: str, order: str) -> None:
    options = ["exchange=events", f"declare={exchange_type}", "heartbeat=30"]
    if order == "declare first":
        options.reverse()
    config = parse_sink_url(f"{BASE}?{'&'.join(options)}")
    assert isinstance(config, AmqpSinkConfig)
    assert (config.exchange, config.declare) == ("events", exchange_type)
    assert "declare" not in config.url and "heartbeat=30" in config.url
    assert "s3cret-pw" not in repr(config) and f"declare='{exchange_type}'" in repr(config)


def test_without_declare_nothing_is_declared() -> None:
    config = parse_sink_url(f"{BASE}?exchange=events")
    assert isinstance(config, AmqpSinkConfig) and config.declare is None


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (
            "exchange=events&declare=Topic",
            "invalid sink option declare='Topic': use one of topic, direct, fanout, headers",
        ),
        ("exchange=events&declare=", "invalid sink option declare='': use one of"),
        ("exchange=events&declare=x-delayed-message", "invalid sink option declare='x-delayed-message'"),
        ("declare=topic", "declare=topic in 'amqp://app:***@rabbit:5672/%2F?declare=topic' needs a named exchange"),
        ("exchange=&declare=direct", "needs a named exchange (&exchange=NAME)"),
        ("exchange=events&declare=topic&declare=topic", "sink option 'declare' is given twice"),
    ],
)
def test_a_bad_declare_is_a_one_line_config_error_without_the_password(query: str, expected: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_sink_url(f"{BASE}?{query}")
    message = str(refused.value)
    assert expected in message, message
    assert "s3cret-pw" not in message and "\n" not in message


def test_a_declare_value_holding_the_password_is_not_shown() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_sink_url(f"{BASE}?exchange=events&declare=s3cret-pw")
    assert "s3cret-pw" not in str(refused.value)
