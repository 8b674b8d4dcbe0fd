"""A ``--field-header`` a sink could never send is refused at start, not found out event by event.

Every event of a Debezium table carries its field headers, so one that RabbitMQ reserves (``CC``
adds routes) would dead-letter every event, and one that a CloudEvents binding writes itself
(``ce_type``, ``cloudEvents:id``, ``content-type``) would be dropped from every message. No server
is reached: ``serve`` is stubbed.
"""

from __future__ import annotations

from typing import Any

import pytest

from relay import cli

DATABASE = "postgresql://app@127.0.0.1:1/shop"
KAFKA = "kafka://127.0.0.1:9092"
AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``outbox-relay argv`` returns 2 with (a configuration error, found after parsing)."""
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def run(sink: str, *headers: str, routes: tuple[str, ...] = ()) -> list[str]:
    argv = ["run", "--database-url", DATABASE, "--table-layout", "debezium"]
    argv += ["--sink", sink] if sink else []
    for route in routes:
        argv += ["--route", route]
    for header in headers:
        argv += ["--field-header", header]
    return argv


@pytest.mark.parametrize(
    ("sink", "header", "needle"),
    [
        (AMQP, "CC", "reserved by RabbitMQ"),
        (AMQP, "BCC", "reserved by RabbitMQ"),
        (AMQP, "x-death", "reserved by RabbitMQ"),
        (AMQP, "x-first-death-queue", "reserved by RabbitMQ"),
        (AMQP, "x-amqp-1.0-message-annotations", "reserved by RabbitMQ"),
        (AMQP, "h" * 256, "longer than RabbitMQ's 255 bytes"),
        (AMQP, "\u00e9" * 128, "longer than RabbitMQ's 255 bytes"),  # 128 characters, 256 bytes
        (f"{AMQP}?format=cloudevents", "cloudEvents:type", "CloudEvents' own"),
        (f"{AMQP}?format=cloudevents", "cloudEvents_id", "CloudEvents' own"),
        (f"{AMQP}?format=cloudevents-structured", "cloudEvents:source", "CloudEvents' own"),
        (f"{KAFKA}?format=cloudevents", "ce_type", "CloudEvents' own"),
        (f"{KAFKA}?format=cloudevents", "CE_ID", "CloudEvents' own"),
        (f"{KAFKA}?format=cloudevents", "content-type", "CloudEvents' own"),
        (f"{KAFKA}?format=cloudevents-structured", "Content-Type", "CloudEvents' own"),
        (f"{KAFKA}?format=cloudevents-structured", "ce_subject", "CloudEvents' own"),
    ],
)
def test_a_field_header_the_sink_could_never_send_is_refused(
    sink: str, header: str, needle: str, served: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(run(sink, "type=eventType", f"aggregateid={header}"), capsys)
    assert needle in line
    assert f"aggregateid={header[:80]}" in line
    assert "guest:guest" not in line
    assert served == []


def test_a_route_s_sink_is_checked_as_the_catch_all_is(served: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(run(KAFKA, "type=CC", routes=(f"orders.*={AMQP}",)), capsys)
    assert "reserved by RabbitMQ" in line
    assert served == []


@pytest.mark.parametrize(
    ("sink", "header"),
    [
        (KAFKA, "CC"),  # Kafka reads no header
        (KAFKA, "ce_type"),  # the native shape sends it as it is
        (AMQP, "cc"),  # RabbitMQ's names are case-sensitive: cc is the application's
        (AMQP, "Bcc"),
        (AMQP, "x-request-id"),
        (AMQP, "ce_type"),  # the Kafka binding's prefix means nothing to AMQP's
        (f"{AMQP}?format=cloudevents", "content-type"),  # AMQP carries it as a property, not a header
        (f"{KAFKA}?format=cloudevents", "cloudEvents:type"),
        (f"{KAFKA}?format=cloudevents", "eventType"),
    ],
)
def test_a_field_header_the_sink_sends_is_taken(sink: str, header: str, served: list[Any]) -> None:
    assert cli.main(run(sink, f"type={header}")) == 0
    assert [config.layout.field_headers for config in served] == [(("type", header),)]
