"""How an event becomes a broker message, per sink: the relay's own shape or CloudEvents 1.0.

A sink picks its encoder once, from the sink URL's ``format=`` option, and
calls it once per event on the hot path. The CloudEvents encoders follow the
Kafka protocol binding and, as far as AMQP 0-9-1 headers allow, the AMQP
binding. The attributes come from the row's columns: ``id`` the idempotency
key, ``type`` the topic, ``time`` the creation time, ``partitionkey`` the key
(none when null or empty: the extension must not be empty), ``traceparent`` and ``tracestate`` the row's W3C trace
context headers (in any case); an event whose attributes break the spec is refused
(:func:`attribute_refusal`), so dead-lettered. Binary mode never parses the payload: the attributes go in
headers. Structured mode wraps the payload, as it is, in a JSON envelope: a
JSON payload as ``data``, raw bytes as ``data_base64``. docs/cloudevents.md
has the whole mapping.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import UTC, datetime
from json.encoder import encode_basestring as _json_string

from relay.attribute_values import media_type_problem, shown, string_problem
from relay.config import Format
from relay.events import IDEMPOTENCY_HEADER, TRACEPARENT, TRACESTATE, Event, is_idempotency_header, trace_context

SPECVERSION = "1.0"
JSON_CONTENT_TYPE = "application/json"
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
#: The source a sink uses when it is given none (the CLI always gives one).
DEFAULT_EVENT_SOURCE = "/outbox-relay"
KAFKA_PREFIX = "ce_"
AMQP_PREFIX = "cloudEvents:"
#: What the AMQP binding's readers take as attributes: ``cloudEvents:`` and, for JMS, ``cloudEvents_``
#: (the CNCF SDK reads both, the later one winning), so a row header may start with neither.
AMQP_ATTRIBUTE_PREFIXES = (AMQP_PREFIX, "cloudEvents_")
CONTENT_TYPE_HEADER = "content-type"
#: What a content type naming a CloudEvents event format starts with (in any case): both bindings'
#: readers take a message with such a content type for a structured-mode event (``+json``,
#: ``-batch+json``), whatever its headers.
STRUCTURED_MEDIA_PREFIX = "application/cloudevents"

#: A Kafka message: the value and the headers, as confluent-kafka's ``produce`` takes them.
KafkaMessage = tuple[bytes, list[tuple[str, str | bytes | None]]]
#: An AMQP message: the body, its ``content_type`` property (None: no such property) and its headers table.
AmqpMessage = tuple[bytes, str | None, dict[str, str]]
KafkaEncoder = Callable[[Event], KafkaMessage]
AmqpEncoder = Callable[[Event], AmqpMessage]


def rfc3339(moment: datetime) -> str:
    """``moment`` in RFC 3339, in UTC with microseconds (a time without a zone is taken as UTC)."""
    return Rfc3339()(moment)


class Rfc3339:
    """Formats times as :func:`rfc3339` does, each second's part once.

    Half the cost of ``isoformat`` for times that share their second with the
    one before, as the events of a claim mostly do. One per encoder: a sink
    calls its encoder from one thread.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[datetime | None, str] = (None, "")

    def __call__(self, moment: datetime) -> str:
        # From the fields, not a float timestamp: int() of one truncates toward zero (a second
        # late before 1970), and a float has no room for the microseconds of year 9999 (it
        # rounds them into year 10000). Years below 1000 keep their four digits.
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        elif moment.tzinfo is not UTC:
            moment = moment.astimezone(UTC)
        second = moment.replace(microsecond=0)
        last = self._last
        if last[0] != second:
            m = moment
            last = self._last = (
                second,
                f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}.",
            )
        return f"{last[1]}{moment.microsecond:06d}Z"


def _trace_context(headers: dict[str, str]) -> list[tuple[str, str]]:
    # In any case of the row's names (relay.events.trace_context): the extensions' names are lower case.
    return list(trace_context(headers).items())


def envelope_encoder(source: str) -> Callable[[Event], bytes]:
    """Structured mode's encoder for ``source``: an event as one ``application/cloudevents+json``
    document, the parts every event shares encoded once.

    A JSON payload (no content type) is spliced in as ``data`` without being
    parsed: the store hands over valid JSON. Raw bytes go as ``data_base64``,
    whatever their content type, so they arrive exactly as written.
    """
    head = '{"specversion":"' + SPECVERSION + '","source":' + _json_string(source)
    clock = Rfc3339()

    def encode(event: Event) -> bytes:
        parts = [head, ',"id":', _json_string(event.idempotency_key), ',"type":', _json_string(event.topic)]
        parts += [',"time":"', clock(event.created_at), '"']
        if event.key:
            parts += [',"partitionkey":', _json_string(event.key)]
        if event.headers:
            for name, value in _trace_context(event.headers):
                parts += [",", _json_string(name), ":", _json_string(value)]
        if event.content_type is not None:
            parts += [',"datacontenttype":', _json_string(event.content_type), ',"data_base64":"']
            parts += [base64.b64encode(event.payload).decode("ascii"), '"}']
            return "".join(parts).encode()
        if not event.payload:  # no data (a Debezium row's null payload): no data attributes either
            parts.append("}")
            return "".join(parts).encode()
        parts.append(',"datacontenttype":"application/json","data":')
        return b"".join(("".join(parts).encode(), event.payload, b"}"))

    return encode


def _own_headers(event: Event, clashes: Callable[[str], bool]) -> list[tuple[str, str]]:
    """The relay's headers (the row's and ``idempotency-key``) but those a binding's headers replace:
    ``clashes`` must take ``idempotency-key`` too, so that a message carries the relay's alone."""
    pairs = [(name, value) for name, value in event.headers.items() if not clashes(name)] if event.headers else []
    pairs.append((IDEMPOTENCY_HEADER, event.idempotency_key))
    return pairs


def kafka_binding_header(name: str) -> bool:
    """Whether a row header ``name`` gives way to the Kafka binding's own in a CloudEvents format."""
    # A row's idempotency-key (in any case) gives way to the relay's, as in the native shape:
    # Kafka headers are a list, and a consumer reading the first of two would take the row's.
    lower = name.lower()
    return lower in (CONTENT_TYPE_HEADER, IDEMPOTENCY_HEADER) or lower.startswith(KAFKA_PREFIX)


def amqp_binding_header(name: str) -> bool:
    """Whether a row header ``name`` gives way to the AMQP binding's own in a CloudEvents format."""
    return name.startswith(AMQP_ATTRIBUTE_PREFIXES) or is_idempotency_header(name)


def gives_way(chosen: Format, name: str, binding_header: Callable[[str], bool]) -> bool:
    """Whether a row header ``name`` gives way to the binding's own in format ``chosen`` (it is never sent);
    ``binding_header`` is the sink kind's (its encoder family, see :mod:`relay.sinks.registry`)."""
    return chosen is not Format.NATIVE and binding_header(name)


def kafka_native(event: Event) -> KafkaMessage:
    """The relay's own Kafka message: the payload, the row's headers and ``idempotency-key``
    (and ``content-type`` for a payload of raw bytes: the column's, in place of a row header
    of that name in any case, so that a consumer never sees two)."""
    if event.content_type is None:
        return event.payload, event.message_header_pairs()
    pairs = [pair for pair in event.message_header_pairs() if pair[0].lower() != CONTENT_TYPE_HEADER]
    return event.payload, [*pairs, (CONTENT_TYPE_HEADER, event.content_type)]


def _amqp_content_type(event: Event) -> str | None:
    # An empty payload without a content type (a Debezium row's null payload) is no JSON:
    # it goes without the property, as it goes without the header on Kafka.
    if event.content_type is not None:
        return event.content_type
    return JSON_CONTENT_TYPE if event.payload else None


def amqp_native(event: Event) -> AmqpMessage:
    """The relay's own AMQP message: the payload with its content type (``application/json``
    for JSON, none for an empty payload without one), the row's headers and ``idempotency-key``."""
    return event.payload, _amqp_content_type(event), event.message_headers()


def binary_mode_refusal(event: Event) -> str | None:
    """Why ``event`` cannot go in binary content mode, or None.

    Binary mode gives the payload's content type as ``datacontenttype``; one
    naming a CloudEvents format makes a reader of either binding take the
    payload for the event itself, its own ``id``, ``source`` and ``type`` in
    place of the relay's (or fail on it). Such an event is dead-lettered, as
    an event the broker could never take is: nothing can send it in binary
    mode as written, and a structured envelope in its place would be another
    shape than the sink's consumers expect.
    """
    content_type = event.content_type
    if content_type is None or not content_type.lstrip().lower().startswith(STRUCTURED_MEDIA_PREFIX):
        return None
    return (
        f"content type {content_type[:60]!r} names a CloudEvents format: in binary mode (format=cloudevents) "
        "consumers would read the payload as the event, with its own id, source and type; send such payloads "
        "with format=cloudevents-structured, or store them under another content type"
    )


def attribute_refusal(event: Event) -> str | None:
    """Why the attributes ``event`` takes from its row break the CloudEvents spec, or None.

    ``id``, ``type``, ``partitionkey`` and the trace context must be Strings
    (no control characters, noncharacters or lone surrogates), ``id`` and
    ``type`` not empty, and ``datacontenttype`` a media type
    (:mod:`relay.attribute_values`). Either binding puts them in headers, and
    a consumer forwarding them over HTTP in HTTP headers, where a line break
    starts a header of the row's choosing. Nothing can send such an event as
    written, in either mode: it is dead-lettered at once, with this reason.
    """
    for name, value in (("id", event.idempotency_key), ("type", event.topic)):
        if not value:
            return f"CloudEvents attribute {name} would be empty (the row's {_COLUMNS[name]})"
        if problem := string_problem(value):
            return _attribute_error(name, value, problem)
    if event.key and (problem := string_problem(event.key)):
        return _attribute_error("partitionkey", event.key, problem)
    if event.content_type is not None and (problem := media_type_problem(event.content_type)):
        return _attribute_error("datacontenttype", event.content_type, problem)
    if event.headers:
        for name, value in _trace_context(event.headers):
            if problem := string_problem(value):
                return _attribute_error(name, value, problem)
    return None


#: The column each attribute comes from, for the reason an event is dead-lettered.
_COLUMNS = {
    "id": "idempotency_key",
    "type": "topic",
    "partitionkey": "key",
    "datacontenttype": "content_type",
    TRACEPARENT: "traceparent header",
    TRACESTATE: "tracestate header",
}


def _attribute_error(name: str, value: str, problem: str) -> str:
    return (
        f"CloudEvents attribute {name} {shown(value)} (the row's {_COLUMNS[name]}) {problem}: "
        "the spec does not allow it, and consumers would forward it as a header"
    )


def _binary_refusal(event: Event) -> str | None:
    return binary_mode_refusal(event) or attribute_refusal(event)


def refusal_of(chosen: Format) -> Callable[[Event], str | None] | None:
    """The check that refuses, per event, what format ``chosen`` cannot send as written; None if it sends all."""
    if chosen is Format.CLOUDEVENTS:
        return _binary_refusal
    return attribute_refusal if chosen is Format.CLOUDEVENTS_STRUCTURED else None


def kafka_encoder(chosen: Format, source: str = DEFAULT_EVENT_SOURCE) -> KafkaEncoder:
    """The encoder of a Kafka sink with format ``chosen`` and CloudEvents ``source``."""
    if chosen is Format.NATIVE:
        return kafka_native
    if chosen is Format.CLOUDEVENTS_STRUCTURED:
        wrap = envelope_encoder(source)

        def kafka_structured(event: Event) -> KafkaMessage:
            headers: list[tuple[str, str | bytes | None]] = [(CONTENT_TYPE_HEADER, STRUCTURED_CONTENT_TYPE)]
            headers += _own_headers(event, kafka_binding_header)
            return wrap(event), headers

        return kafka_structured

    # Built once: the headers every message of the sink carries alike.
    specversion = (KAFKA_PREFIX + "specversion", SPECVERSION)
    source_header = (KAFKA_PREFIX + "source", source)
    clock = Rfc3339()

    def kafka_binary(event: Event) -> KafkaMessage:
        headers: list[tuple[str, str | bytes | None]] = [
            specversion,
            ("ce_id", event.idempotency_key),
            source_header,
            ("ce_type", event.topic),
            ("ce_time", clock(event.created_at)),
        ]
        if event.payload or event.content_type is not None:  # no data, no datacontenttype
            headers.append((CONTENT_TYPE_HEADER, event.content_type or JSON_CONTENT_TYPE))
        if event.key:
            headers.append(("ce_partitionkey", event.key))
        if event.headers:
            headers += [(KAFKA_PREFIX + name, value) for name, value in _trace_context(event.headers)]
            headers += [(name, value) for name, value in event.headers.items() if not kafka_binding_header(name)]
        headers.append((IDEMPOTENCY_HEADER, event.idempotency_key))
        return event.payload, headers

    return kafka_binary


def amqp_encoder(chosen: Format, source: str = DEFAULT_EVENT_SOURCE) -> AmqpEncoder:
    """The encoder of a RabbitMQ sink with format ``chosen`` and CloudEvents ``source``.

    ``message_id`` is the idempotency key in every format, so the CloudEvents
    ``id`` there too; the sink sets it.
    """
    if chosen is Format.NATIVE:
        return amqp_native
    if chosen is Format.CLOUDEVENTS_STRUCTURED:
        wrap = envelope_encoder(source)

        def amqp_structured(event: Event) -> AmqpMessage:
            return wrap(event), STRUCTURED_CONTENT_TYPE, dict(_own_headers(event, amqp_binding_header))

        return amqp_structured

    clock = Rfc3339()

    def amqp_binary(event: Event) -> AmqpMessage:
        headers = {
            "cloudEvents:specversion": SPECVERSION,
            "cloudEvents:id": event.idempotency_key,
            "cloudEvents:source": source,
            "cloudEvents:type": event.topic,
            "cloudEvents:time": clock(event.created_at),
        }
        if event.key:
            headers["cloudEvents:partitionkey"] = event.key
        if event.headers:
            headers.update((AMQP_PREFIX + name, value) for name, value in _trace_context(event.headers))
            headers.update((name, value) for name, value in event.headers.items() if not amqp_binding_header(name))
        headers[IDEMPOTENCY_HEADER] = event.idempotency_key
        return event.payload, _amqp_content_type(event), headers

    return amqp_binary
