"""What PostgreSQL cannot store (relay.stored_text): the writers' checks and the log source's ask the same room."""

from __future__ import annotations

import json

import pytest

from relay.stored_text import has_json_nul, has_lone_surrogate, refuse_json_constant


@pytest.mark.parametrize(
    ("text", "nul"),
    [
        ('"a\\u0000"', True),
        ('{"\\u0000": 1}', True),
        ('"\\\\\\u0000"', True),  # an escaped backslash, then the NUL
        ('"\\\\u0000"', False),  # a backslash, then the letters u0000
        ('"\\\\\\\\u0000"', False),
        ('"u0000"', False),
        ('"\\u00000"', True),
        ("[]", False),
    ],
)
def test_a_nul_is_found_only_where_the_json_spells_one(text: str, nul: bool) -> None:
    assert has_json_nul(text) is nul


@pytest.mark.parametrize(
    ("text", "lone"),
    [("\ud800", True), ("a\udfffb", True), ("\U0001f600", False), ("é", False), ("", False), ("\ud83d\ude00", True)],
)
def test_a_lone_surrogate_is_one_no_utf_8_can_hold(text: str, lone: bool) -> None:
    assert has_lone_surrogate(text) is lone


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_the_json_constants_are_refused(constant: str) -> None:
    with pytest.raises(ValueError, match=f"{constant} is not a JSON number"):
        json.loads(f"[{constant}]", parse_constant=refuse_json_constant)
