"""The relay reads an event's W3C trace context whatever the case of the header names (no I/O).

Both readers: the batch span's links, and the CloudEvents encoders' ``traceparent``
and ``tracestate`` extensions.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import format_span_id, format_trace_id

from relay.config import Format
from relay.events import Event
from relay.sinks.formats import amqp_encoder, envelope_encoder, kafka_encoder
from relay.tracing import event_links

_ids = itertools.count(1)


def event(headers: dict[str, str]) -> Event:
    return Event(
        id=next(_ids),
        topic="t",
        key=None,
        payload=b"{}",
        headers=headers,
        idempotency_key=f"k{next(_ids)}",
        attempts=0,
        created_at=datetime.now(UTC),
    )


def traceparent(trace_id: int, span_id: int) -> str:
    return f"00-{format_trace_id(trace_id)}-{format_span_id(span_id)}-01"


def links(*headers: dict[str, str]) -> list[tuple[int, int, str]]:
    """(trace id, span id, tracestate) of each link the batch of these events' headers gets."""
    found = event_links([event(h) for h in headers], TraceContextTextMapPropagator())
    return [(link.context.trace_id, link.context.span_id, link.context.trace_state.to_header()) for link in found]


#: Every way a writer (or a library that capitalises header names) may spell the two names.
CASINGS = [
    ("traceparent", "tracestate"),
    ("Traceparent", "Tracestate"),
    ("TraceParent", "TraceState"),
    ("TRACEPARENT", "TRACESTATE"),
    ("tRACEPARENT", "tRACESTATE"),
    ("traceParent", "traceState"),
    ("TracepareNT", "tracestatE"),
]


@pytest.mark.parametrize(("parent_name", "state_name"), CASINGS)
def test_the_trace_context_is_read_in_any_case(parent_name: str, state_name: str) -> None:
    headers = {"other": "x", parent_name: traceparent(0xABC, 0xDEF), state_name: "vendor=v1,other=v2"}
    assert links(headers) == [(0xABC, 0xDEF, "vendor=v1,other=v2")]


def test_a_batch_of_events_in_every_casing_links_each_producer_once() -> None:
    batch = [{name: traceparent(7, span)} for span, (name, _) in enumerate(CASINGS, start=1)]
    batch += [{name.upper(): traceparent(7, span)} for span, (name, _) in enumerate(CASINGS, start=1)]
    assert links(*batch) == [(7, span, "") for span in range(1, len(CASINGS) + 1)]


@pytest.mark.parametrize(
    "name",
    [
        "traceparent ",  # not the name: HTTP names hold no spaces
        "trace-parent",
        "traceparents",
        "x-traceparent",
        "\u0163raceparent",
    ],
)
def test_names_that_are_not_traceparent_give_no_link(name: str) -> None:
    assert links({name: traceparent(1, 2)}) == []


def test_a_name_only_unicode_folding_makes_tracestate_is_not_tracestate() -> None:
    # "\u017f" (long s) casefolds to "s"; no HTTP header name holds it.
    assert links({"traceparent": traceparent(1, 2), "trace\u017ftate": "a=1"}) == [(1, 2, "")]


def test_a_traceparent_repeated_in_two_cases_with_different_values_is_invalid() -> None:
    # W3C Trace Context: duplicated traceparent headers are invalid, so no parent is guessed.
    assert links({"traceparent": traceparent(1, 2), "Traceparent": traceparent(3, 4)}) == []
    # The same value twice is one context.
    assert links({"traceparent": traceparent(1, 2), "TRACEPARENT": traceparent(1, 2)}) == [(1, 2, "")]


def test_tracestate_entries_in_several_cases_are_combined_in_order() -> None:
    headers = {"Traceparent": traceparent(1, 2), "tracestate": "a=1", "TraceState": "b=2"}
    assert links(headers) == [(1, 2, "a=1,b=2")]


def extensions(headers: dict[str, str]) -> list[Mapping[str, object]]:
    """The trace extensions each CloudEvents encoding gives an event with these headers."""
    e = event(headers)
    _, kafka_headers = kafka_encoder(Format.CLOUDEVENTS)(e)
    _, _, amqp_headers = amqp_encoder(Format.CLOUDEVENTS)(e)
    document = json.loads(envelope_encoder("/s")(e))
    kafka_ce = {name.removeprefix("ce_"): value for name, value in kafka_headers if name.startswith("ce_trace")}
    amqp_ce = {name.removeprefix("cloudEvents:"): v for name, v in amqp_headers.items() if "cloudEvents:trace" in name}
    structured = {name: value for name, value in document.items() if name.startswith("trace")}
    return [kafka_ce, amqp_ce, structured]


@pytest.mark.parametrize(("parent_name", "state_name"), CASINGS)
def test_cloudevents_carry_the_trace_context_in_any_case(parent_name: str, state_name: str) -> None:
    headers = {parent_name: traceparent(1, 2), state_name: "vendor=v1"}
    expected = {"traceparent": traceparent(1, 2), "tracestate": "vendor=v1"}
    assert extensions(headers) == [expected] * 3


def test_cloudevents_leave_out_a_traceparent_given_twice_with_different_values() -> None:
    headers = {"traceparent": traceparent(1, 2), "TRACEPARENT": traceparent(3, 4), "tracestate": "a=1"}
    assert extensions(headers) == [{}] * 3
