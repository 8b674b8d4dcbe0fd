"""What PostgreSQL cannot store of text and JSON text: one room for the writers' checks and the relay's.

``producers`` refuse these before any SQL (refused by the server, they would
abort the caller's transaction); the log source dead-letters a message whose
envelope holds one (plain SQL wrote it, and no column checked it). Both ask here.
"""

from __future__ import annotations

import re
from typing import Any

#: A NUL character in JSON text: \u0000 after an even number of backslashes (an odd number spells a backslash).
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def has_json_nul(text: str) -> bool:
    """Whether JSON ``text`` spells a NUL character (``\\u0000``), which ``jsonb`` refuses."""
    return "\\u0000" in text and _NUL_ESCAPE.search(text) is not None


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (U+D800-U+DFFF unpaired), which no UTF-8 text has (nor bytes
    that are not UTF-8, which Python holds as lone surrogates: ``surrogateescape``)."""
    if text.isascii():  # isascii() reads a flag the string carries
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def refuse_json_constant(name: str) -> Any:
    """A ``parse_constant`` for ``json``: ``NaN``, ``Infinity`` and ``-Infinity`` are no JSON, and no ``jsonb``."""
    raise ValueError(f"{name} is not a JSON number")
