"""publish()'s own cheaper ways to what the standard library writes: the default idempotency key is
``str(uuid.uuid4())``'s text, the JSON text ``json.dumps(value, allow_nan=False)``'s, and the
message envelope the JSON of the checked arguments."""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest

from producers._arguments import _json_text, _params, uuid4_text
from producers._message import envelope

CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def test_a_new_key_is_a_version_4_uuid_written_as_uuid_writes_it() -> None:
    for _ in range(1000):
        text = uuid4_text()
        parsed = uuid.UUID(text)
        assert CANONICAL_UUID.fullmatch(text), text
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == text


@pytest.mark.parametrize("random", [bytes(16), b"\xff" * 16, bytes(range(16)), bytes(range(240, 256))])
def test_a_new_key_is_uuid4s_text_of_the_same_random_bytes(monkeypatch: pytest.MonkeyPatch, random: bytes) -> None:
    monkeypatch.setattr(os, "urandom", lambda n: random[:n])
    assert uuid4_text() == str(uuid.UUID(bytes=random, version=4))


def test_new_keys_are_random_in_every_bit_but_version_and_variant() -> None:
    keys = [uuid.UUID(uuid4_text()).int for _ in range(4000)]
    assert len(set(keys)) == len(keys)
    ones = zeros = 0
    for key in keys:
        ones |= key
        zeros |= ~key
    fixed = (0xF << 76) | (0x3 << 62)  # the version's four bits, the variant's two
    random_bits = ((1 << 128) - 1) & ~fixed
    assert ones & random_bits == random_bits and zeros & random_bits == random_bits
    assert {key >> 76 & 0xF for key in keys} == {4} and {key >> 62 & 0x3 for key in keys} == {2}


class _Ints(int):
    pass


JSON_VALUES: list[Any] = [
    {"event": "order.created", "order_id": 1, "amount_cents": 4200},
    {"a": [1, [2, [3, {"b": None}]]], "c": {"d": {"e": [True, False]}}},
    [],
    {},
    [[], {}],
    None,
    True,
    0,
    "",
    "caf\u00e9 \u00fcber \u4e2d\u6587 \u0645\u0631\u062d\u0628\u0627",
    {"\u00e9": "\U0001f600 \U0001d11e"},  # past the BMP: written as surrogate pairs
    'quote " backslash \\ slash / tab \t newline \n bell \x07 del \x7f \u2028',
    2**64,
    -(2**200),
    _Ints(7),
    0.1,
    -0.0,
    1e300,
    5e-324,
    1.7976931348623157e308,
    [1.5, -2.25, 3.0],
    {1: "int key", 2.5: "float key", False: "bool key", None: "null key"},
    ("a", ("b",)),
    ["</script>", "\ufeff", "\ud7ff", "\ue000"],
]


@pytest.mark.parametrize("value", JSON_VALUES)
def test_the_json_text_is_json_dumps_text(value: Any) -> None:
    assert _json_text(value, "payload") == json.dumps(value, allow_nan=False)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, {"a": [1, math.nan]}, [float("inf")]])
def test_nan_and_infinity_are_refused_as_json_dumps_refuses_them(value: Any) -> None:
    with pytest.raises(ValueError) as dumped:
        json.dumps(value, allow_nan=False)
    with pytest.raises(ValueError) as refused:
        _json_text(value, "payload")
    assert str(refused.value) == f"payload cannot be written as JSON: {dumped.value}"


def test_a_circular_value_and_a_lone_surrogate_are_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="payload cannot be written as JSON: Circular reference detected"):
        _json_text(loop, "payload")
    with pytest.raises(ValueError, match="payload holds a lone surrogate"):
        _json_text({"a": "\ud800"}, "payload")
    # The shared encoder keeps no trace of a refused value: the next one is written whole.
    assert _json_text([1, {"a": [2]}], "payload") == '[1, {"a": [2]}]'


def test_what_json_cannot_encode_is_left_to_the_connections_dumper() -> None:
    assert _json_text({"a": {1, 2}}, "payload") is None


def _checked(**given: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {"topic": "t", "payload": {"n": 1}, "key": None, "headers": None}
    arguments.update(given)
    return _params(
        arguments["topic"], arguments["payload"], None, arguments["key"], arguments["headers"],
        arguments.get("idempotency_key"), None, 0, timedelta(days=1),
    )  # fmt: skip


@pytest.mark.parametrize("headers", [None, {}])
def test_no_headers_are_the_empty_object(headers: dict[str, str] | None) -> None:
    params = _checked(headers=headers)
    assert (params["headers"], params["headers_json"]) == ({}, "{}")
    assert CANONICAL_UUID.fullmatch(params["idempotency_key"])


@pytest.mark.parametrize(
    ("what", "given"),
    [
        ("topic", {"topic": "caf\u00e9\x00", "key": "\u00e9", "idempotency_key": "\u00e9"}),
        ("key", {"topic": "caf\u00e9", "key": "\u00e9\x00", "idempotency_key": "\u00e9"}),
        ("idempotency_key", {"topic": "caf\u00e9", "key": "\u00e9", "idempotency_key": "\u00e9\x00"}),
        ("key", {"topic": "t", "key": "k\x00"}),
        ("idempotency_key", {"topic": "t", "key": "k", "idempotency_key": "i\x00"}),
    ],
)
def test_a_nul_character_is_refused_naming_its_argument_among_non_ascii_ones(what: str, given: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=rf"^{what} holds a NUL character"):
        _checked(**given)


@pytest.mark.parametrize(
    ("what", "given"),
    [
        ("topic", {"topic": "\u00e9\ud800", "key": "\u00e9"}),
        ("key", {"topic": "\u00e9", "key": "\u00e9\udfff"}),
        ("idempotency_key", {"topic": "t\u00e9", "key": "\U0001f600", "idempotency_key": "\udc80"}),
    ],
)
def test_a_lone_surrogate_is_refused_naming_its_argument(what: str, given: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=rf"^{what} holds a lone surrogate"):
        _checked(**given)


def test_non_ascii_texts_pass() -> None:
    params = _checked(topic="caf\u00e9", key="\U0001f600", idempotency_key="\u00fc")
    assert (params["topic"], params["key"], params["idempotency_key"]) == ("caf\u00e9", "\U0001f600", "\u00fc")


TRICKY = ["t", "caf\u00e9", 'quote " and \\ backslash', "\U0001f600", "line\nbreak \u2028", "</script>"]


@pytest.mark.parametrize("text", TRICKY)
@pytest.mark.parametrize("with_key", [True, False])
def test_the_envelope_is_the_json_of_the_checked_arguments(text: str, with_key: bool) -> None:
    payload = {"text": text, "n": [1, 2.5, None]}
    params = _checked(topic=text, key=text if with_key else None, headers={text: text}, idempotency_key=text)
    assert json.loads(envelope(params)) == {
        "topic": text,
        "key": text if with_key else None,
        "payload": {"n": 1},
        "headers": {text: text},
        "idempotency_key": text,
    }
    params = _checked(topic=text, payload=payload)
    written = json.loads(envelope(params))
    assert written == {"topic": text, "key": None, "payload": payload, "idempotency_key": params["idempotency_key"]}
    assert envelope(params).isascii()


@pytest.mark.parametrize("headers", [None, {"h": "\u00e9"}])
def test_a_bytes_envelope_carries_base64_and_its_content_type(headers: dict[str, str] | None) -> None:
    params = _params("t", b"\x00\xffraw", "application/x-protobuf", "k", headers, "i", None, 0, timedelta(days=1))
    assert json.loads(envelope(params)) == {
        "topic": "t",
        "key": "k",
        "payload": "AP9yYXc=",
        "content_type": "application/x-protobuf",
        **({"headers": headers} if headers else {}),
        "idempotency_key": "i",
    }
