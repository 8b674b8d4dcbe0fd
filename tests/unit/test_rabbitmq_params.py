"""pika's connection parameters from an amqp:// sink URL: its options in seconds are finite.

pika takes ``socket_timeout=nan`` (its check is "not <= 0", which NaN passes) and infinity:
the relay started with a connect, a stack or a blocked-connection wait that never ends.
"""

from __future__ import annotations

import math

import pytest

from relay.errors import ConfigError
from relay.sinks.rabbitmq.params import connection_parameters

URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
SECONDS_OPTIONS = ["socket_timeout", "stack_timeout", "blocked_connection_timeout", "retry_delay"]


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "Infinity", "1e999", "-inf"])
@pytest.mark.parametrize("option", SECONDS_OPTIONS)
def test_an_option_in_seconds_that_is_not_finite_is_refused(option: str, value: str) -> None:
    with pytest.raises(ConfigError, match=option):
        connection_parameters(f"{URL}?{option}={value}", connect_timeout=10.0, heartbeat=30, blocked_timeout=60.0)


@pytest.mark.parametrize("option", SECONDS_OPTIONS)
def test_an_option_in_seconds_that_is_finite_is_taken(option: str) -> None:
    params = connection_parameters(f"{URL}?{option}=2.5", connect_timeout=10.0, heartbeat=30, blocked_timeout=60.0)
    assert getattr(params, option) == 2.5
    defaults = connection_parameters(URL, connect_timeout=10.0, heartbeat=30, blocked_timeout=60.0)
    assert all(math.isfinite(getattr(defaults, name)) for name in SECONDS_OPTIONS)
