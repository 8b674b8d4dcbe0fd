"""CloudEvents attributes taken from rows are checked against the spec before they go out.

A String holds no control character (U+0000-U+001F, U+007F-U+009F), no
noncharacter and no lone surrogate; ``id`` and ``type`` are not empty;
``datacontenttype`` is a media type. An event that breaks one is refused by
both CloudEvents modes, on both sinks' formats (dead-lettered at once, the
reason naming the attribute); the native shape sends rows as written.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from relay.attribute_values import media_type_problem, string_problem
from relay.config import Format
from relay.events import Event
from relay.sinks.formats import amqp_encoder, attribute_refusal, kafka_encoder, refusal_of

CE_FORMATS = [Format.CLOUDEVENTS, Format.CLOUDEVENTS_STRUCTURED]

#: Strings the spec forbids, each with a forbidden character of another kind.
BAD_STRINGS = [
    "a\nb",
    "a\x00b",
    "\r\nX-Injected: 1",
    "tab\there",
    "bell\x07",
    "del\x7f",
    "c1\x85",
    "c1\x9f",
    "lone\ud800",
    "lone\udfff",
    "non\ufffe",
    "non\uffff",
    "non\ufdd0",
    "plane1\U0001fffe",
    "last\U0010ffff",
]
GOOD_STRINGS = ["orders.created", "ördérs ☃ 😀", "with spaces", "a\u00a0b", "\ufdcf\ufdf0", "x" * 300]

BAD_MEDIA_TYPES = [
    "text/plain\r\nX-Injected: 1",
    "text/plain\n",
    "application/json\x00",
    "text/plain\t",
    "not a media type",
    "text",
    "text/",
    "/plain",
    "text/plain/x",
    "text/plain;",
    "text/plain; charset",
    "text/plain; =utf-8",
    " text/plain",
    "text/plain ",
    "tëxt/plain",
    'text/plain; q="unterminated',
    "text/plain; q=a b",
    "text/(plain)",
    "a/b; c=d\x85",
]
GOOD_MEDIA_TYPES = [
    "application/json",
    "application/x-protobuf",
    "text/plain; charset=utf-8",
    "text/plain;charset=UTF-8",
    'application/vnd.api+json; version=2; ext="a b;c"',
    'text/x\'y; q="\\\\\\"é"',
    "Image/PNG",
]


def event(**changes: object) -> Event:
    base = Event(
        id=1,
        topic="orders.created",
        key="order-7",
        payload=b"\x00\x01",
        headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "t\n1"},
        idempotency_key="idem-1",
        attempts=0,
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
        content_type="application/x-protobuf",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def refused_by_every_ce_format(e: Event) -> list[str]:
    """The reason each CloudEvents mode gives, for the Kafka and the AMQP sink alike (both ask refusal_of)."""
    reasons = []
    for chosen in CE_FORMATS:
        refuse = refusal_of(chosen)
        assert refuse is not None
        why = refuse(e)
        assert why is not None, (chosen, e)
        reasons.append(why)
    assert refusal_of(Format.NATIVE) is None  # the relay's own shape sends rows as written
    return reasons


@pytest.mark.parametrize(
    ("attribute", "column"), [("type", "topic"), ("id", "idempotency_key"), ("partitionkey", "key")]
)
@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_a_string_attribute_the_spec_forbids_is_refused(attribute: str, column: str, bad: str) -> None:
    assert string_problem(bad) is not None
    for why in refused_by_every_ce_format(event(**{"topic" if column == "topic" else column: bad})):
        assert why.startswith(f"CloudEvents attribute {attribute} ") and f"the row's {column}" in why
        assert bad not in why and "\n" not in why and "\x00" not in why  # shown escaped, on one line


@pytest.mark.parametrize("name", ["traceparent", "TraceState"])
@pytest.mark.parametrize("bad", BAD_STRINGS[:6])
def test_a_trace_context_value_the_spec_forbids_is_refused(name: str, bad: str) -> None:
    for why in refused_by_every_ce_format(event(headers={name: bad})):
        assert f"attribute {name.lower()} " in why


@pytest.mark.parametrize("bad", BAD_MEDIA_TYPES)
def test_a_content_type_that_is_no_media_type_is_refused(bad: str) -> None:
    assert media_type_problem(bad) is not None
    for why in refused_by_every_ce_format(event(content_type=bad)):
        assert why.startswith("CloudEvents attribute datacontenttype ") and "\n" not in why


@pytest.mark.parametrize("attribute", ["id", "type"])
def test_an_empty_id_or_type_is_refused(attribute: str) -> None:
    column = {"id": "idempotency_key", "type": "topic"}[attribute]
    for why in refused_by_every_ce_format(event(**{column: ""})):
        assert f"attribute {attribute} would be empty" in why


@pytest.mark.parametrize("good", GOOD_STRINGS)
@pytest.mark.parametrize("chosen", CE_FORMATS)
def test_strings_the_spec_allows_go_out(good: str, chosen: Format) -> None:
    e = event(topic=good, key=good, idempotency_key=good, headers={"tracestate": good, "tenant": "t"})
    refuse = refusal_of(chosen)
    assert refuse is not None and refuse(e) is None
    kafka_encoder(chosen, "/s")(e)
    amqp_encoder(chosen, "/s")(e)


@pytest.mark.parametrize("good", GOOD_MEDIA_TYPES)
def test_media_types_go_out(good: str) -> None:
    assert media_type_problem(good) is None
    assert attribute_refusal(event(content_type=good)) is None


def test_a_null_key_and_a_json_payload_need_no_check() -> None:
    assert attribute_refusal(event(key=None, content_type=None, headers={})) is None
    assert attribute_refusal(event(key="", content_type=None)) is None  # no partitionkey at all
