"""A message event's payload is PostgreSQL's own jsonb text of the envelope's payload (decode.message_event),
over a family of JSON texts: nested objects, unicode, escapes, big and small numbers, exponents, duplicate
keys, empty containers, odd whitespace. Each is compared with ``'<text>'::jsonb::text``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relay.sources.log.decode import message_event

pytestmark = pytest.mark.timeout(300)
NOW = datetime(2026, 12, 7, tzinfo=UTC)

#: Texts of a JSON number: integers of any size, fractions, exponents, negative zeros, trailing zeros.
_digits = st.text("0123456789", min_size=1, max_size=40).map(lambda d: d.lstrip("0") or "0")
numbers = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.builds(
        lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
        st.sampled_from(["", "-"]),
        _digits,
        st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=20).map(lambda f: "." + f)),
        st.one_of(st.just(""), st.builds(lambda e, s, n: f"{e}{s}{n}", st.sampled_from("eE"),
                                         st.sampled_from(["", "+", "-"]), st.integers(0, 30))),
    ),
    st.sampled_from(["-0", "0.0", "-0.0", "1e0", "1.50", "1E+2", "-0.000e-5", "123456789012345678901234567890.5"]),
)  # fmt: skip
#: Strings as a writer may spell them: any character PostgreSQL takes (no NUL, no lone surrogate), escaped
#: by json.dumps with or without ensure_ascii, or in spellings json.dumps never writes.
_chars = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
strings = st.one_of(
    st.builds(lambda text, ascii_only: json.dumps(text, ensure_ascii=ascii_only), _chars, st.booleans()),
    st.sampled_from(['"\\/"', '"\\u00e9t\\u00E9"', '"\\ud83d\\ude00"', '"a\\tb\\u001f"', '"\x7f"', '""']),
)
#: Object keys that share lengths in characters but not in UTF-8 bytes, and collide (duplicates: the last wins).
keys = st.one_of(st.sampled_from(['"a"', '"b"', '"aa"', '"é"', '"z"', '"ab"', '"€"', '"\\u00e9"', '""']), strings)
_space = st.sampled_from(["", " ", "\n", "\t  "])


def _object(pairs: list[tuple[str, str]], space: str) -> str:
    return "{" + space + ("," + space).join(f"{k}{space}:{space}{v}" for k, v in pairs) + space + "}"


json_texts = st.recursive(
    st.one_of(numbers, strings, st.sampled_from(["true", "false", "null", "{}", "[]"])),
    lambda inner: st.one_of(
        st.builds(lambda items, space: "[" + ("," + space).join(items) + "]", st.lists(inner, max_size=5), _space),
        st.builds(_object, st.lists(st.tuples(keys, inner), max_size=6), _space),
    ),
    max_leaves=25,
)


@pytest.fixture(scope="module")
def postgres(pg_admin_url: str) -> Iterator[psycopg.Connection[tuple[str]]]:
    """One connection for every comparison: PostgreSQL prints each text as jsonb."""
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        yield conn


def _as_postgres_prints(conn: psycopg.Connection[tuple[str]], text: str) -> str:
    row = conn.execute("SELECT %s::jsonb::text", [text]).fetchone()
    assert row is not None
    return row[0]


def _payload_of(text: str) -> str:
    envelope = '{"topic": "t", "key": null, "payload": ' + text + ', "idempotency_key": "k"}'
    return message_event(1, envelope.encode(), NOW).payload.decode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=json_texts)
def test_a_message_payload_is_postgresqls_jsonb_text_of_it(postgres: psycopg.Connection[tuple[str]], text: str) -> None:
    assert _payload_of(text) == _as_postgres_prints(postgres, text)


@pytest.mark.parametrize(
    "text",
    ['{"b": 1, "aa": {"é": [], "z": {}}, "a": [1.5e3, -2E-3, 0.10]}', '{"a": 1, "a": {"x": 2}, "a": 3}',
     '{"\\u20ac": 1, "ab": 2, "é": 3}', '[{"k": "\\"\\\\\\b\\f\\n\\r\\t"}, "\\u0001", 1e-7, 12345678901234567890]',
     '{"x": [{"y": [{"z": [1.0, "ü", {"": null}]}]}]}'],
)  # fmt: skip
def test_chosen_payloads_are_postgresqls_jsonb_text(postgres: psycopg.Connection[tuple[str]], text: str) -> None:
    assert _payload_of(text) == _as_postgres_prints(postgres, text)
