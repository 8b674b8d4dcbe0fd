"""What a CloudEvents attribute and a content type may hold.

Attributes taken from rows (``id``, ``type``, ``partitionkey``,
``datacontenttype``, the trace context) go out as message headers, and a
consumer that forwards them over HTTP puts them into HTTP headers: a line
break there splits a header in two. CloudEvents 1.0 (section "Type System")
allows in a String no control character (U+0000-U+001F, U+007F-U+009F), no
noncharacter (U+FDD0-U+FDEF, and the last two code points of every plane) and
no lone surrogate. ``datacontenttype``, and any content type a producer
writes, must be a media type: RFC 2046's ``type/subtype`` and parameters, in
the token and quoted-string syntax of RFC 9110 (section 8.3.1): ASCII but
in a quoted parameter value.
"""

from __future__ import annotations

import re

_NONCHARACTERS = "\ufdd0-\ufdef" + "".join(
    f"{chr(plane + 0xFFFE)}{chr(plane + 0xFFFF)}" for plane in range(0, 0x110000, 0x10000)
)
#: What a CloudEvents String may not hold.
_NOT_IN_STRINGS = re.compile(f"[\x00-\x1f\x7f-\x9f\ud800-\udfff{_NONCHARACTERS}]")
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
#: A quoted parameter value may hold non-ASCII text (RFC 9110's obs-text, as UTF-8); the String rule still holds.
_QUOTED = r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e\xa0-\U0010ffff]|\\[\x20-\x7e\xa0-\U0010ffff])*"'
_MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?: *; *{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))*")
#: How much of a bad value an error shows (repr'd, so a line break shows as ``\n``).
SHOWN_CHARS = 60


def string_problem(value: str) -> str | None:
    """Why ``value`` cannot be a CloudEvents String, or None."""
    found = _NOT_IN_STRINGS.search(value)
    if found is None:
        return None
    char = found.group()
    what = (
        "a lone surrogate"
        if "\ud800" <= char <= "\udfff"
        else "a noncharacter"
        if char > "\x9f"
        else "a control character"
    )
    return f"holds {what} (U+{ord(char):04X} at position {found.start()})"


def media_type_problem(value: str) -> str | None:
    """Why ``value`` is not a media type (``type/subtype[; name=value]...``), or None."""
    if _MEDIA_TYPE.fullmatch(value) is not None:
        return None
    return string_problem(value) or "is not a media type (type/subtype[; name=value]..., RFC 2046)"


def shown(value: str) -> str:
    """``value`` as an error shows it: repr'd, cut to ``SHOWN_CHARS``."""
    return repr(value[:SHOWN_CHARS]) + ("..." if len(value) > SHOWN_CHARS else "")
