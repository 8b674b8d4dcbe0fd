"""A relay imports only the broker client of the sinks it is configured with (both were imported by app.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
from relay import app
from relay.config import RelaySettings, TableName, parse_sink_url
config = app.RunConfig("postgresql://x@h/db", TableName.parse("outbox"), parse_sink_url(sys.argv[1]), RelaySettings())
relay = app.build_relay(config)
print(sorted(m for m in ("confluent_kafka", "pika") if m in sys.modules))
"""


@pytest.mark.parametrize(
    ("sink", "loaded"),
    [
        ("kafka://127.0.0.1:9092", ["confluent_kafka"]),
        ("amqps://u:p@rabbit/%2F?exchange=e&declare=topic", ["pika"]),
    ],
)
def test_only_the_configured_sink_s_client_is_imported(sink: str, loaded: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", CHECK, sink], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(loaded)
