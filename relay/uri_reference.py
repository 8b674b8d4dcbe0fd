"""RFC 3986's URI-reference grammar, and what in a text breaks it, in a few words.

A CloudEvents ``source`` must be a URI-reference, and ``--event-source`` goes
out with every event, so it is checked once at start-up against the grammar
of RFC 3986 (appendix A) itself: urlsplit takes almost anything.
"""

from __future__ import annotations

import re

# The grammar's pieces, named as in RFC 3986 appendix A.
_UNRESERVED_SUB_DELIMS = r"A-Za-z0-9\-._~!$&'()*+,;="
_PCT_ENCODED = r"%[0-9A-Fa-f]{2}"
_PCHAR = rf"(?:[{_UNRESERVED_SUB_DELIMS}:@]|{_PCT_ENCODED})"
_SEGMENT = rf"{_PCHAR}*"
_SEGMENT_NZ = rf"{_PCHAR}+"
_SEGMENT_NZ_NC = rf"(?:[{_UNRESERVED_SUB_DELIMS}@]|{_PCT_ENCODED})+"
_QUERY = rf"(?:{_PCHAR}|[/?])*"  # a fragment takes the same characters
_SCHEME = r"[A-Za-z][A-Za-z0-9+\-.]*"
_H16 = r"[0-9A-Fa-f]{1,4}"
_DEC_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"(?:{_DEC_OCTET}\.){{3}}{_DEC_OCTET}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "|".join(
    [
        rf"(?:{_H16}:){{6}}{_LS32}",
        rf"::(?:{_H16}:){{5}}{_LS32}",
        rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
        rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
        rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
        rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
    ]
)
_IP_LITERAL = rf"\[(?:{_IPV6}|[vV][0-9A-Fa-f]+\.[{_UNRESERVED_SUB_DELIMS}:]+)\]"
_USERINFO = rf"(?:[{_UNRESERVED_SUB_DELIMS}:]|{_PCT_ENCODED})*"
_REG_NAME = rf"(?:[{_UNRESERVED_SUB_DELIMS}]|{_PCT_ENCODED})*"  # an IPv4 address is one too
_AUTHORITY = rf"(?:{_USERINFO}@)?(?:{_IP_LITERAL}|{_REG_NAME})(?::[0-9]*)?"
_PATH_ABEMPTY = rf"(?:/{_SEGMENT})*"
_PATH_ABSOLUTE = rf"/(?:{_SEGMENT_NZ}(?:/{_SEGMENT})*)?"
_TAIL = rf"(?:\?{_QUERY})?(?:#{_QUERY})?"
_URI = rf"{_SCHEME}:(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ}(?:/{_SEGMENT})*|){_TAIL}"
_RELATIVE_REF = rf"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_SEGMENT_NZ_NC}(?:/{_SEGMENT})*|){_TAIL}"

URI_REFERENCE = re.compile(rf"(?:{_URI}|{_RELATIVE_REF})")
IPV6_ADDRESS = re.compile(_IPV6)
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_AUTHORITY_OF = re.compile(rf"^(?:{_SCHEME}:)?//([^/?#]*)")
_HOST_IN_BRACKETS = re.compile(
    r"^(?:[A-Za-z][A-Za-z0-9+\-.]*:)?//(?:[^/?#@]*@)?\[([^\]/?#]*)\](?::[^/?#]*)?(?:[/?#]|$)"
)


def is_uri_reference(text: str) -> bool:
    """Whether ``text`` is a URI-reference of RFC 3986 (no IRI: non-ASCII must be percent-encoded)."""
    return URI_REFERENCE.fullmatch(text) is not None


def problem(text: str) -> str | None:
    """What keeps ``text`` from being a URI-reference, in a few words that never quote it; None if it is one."""
    if is_uri_reference(text):
        return None
    if not text.isascii():
        return "a character that is not ASCII must be percent-encoded (as UTF-8)"
    if _BAD_PERCENT.search(text):
        return "'%' must start a percent-encoding of two hex digits (write %25 for '%' itself)"
    if text.count("#") > 1:
        return "a second '#': one starts the fragment, others must be percent-encoded (%23)"
    if "[" in text or "]" in text:
        bracketed = _HOST_IN_BRACKETS.match(text)
        if bracketed is None:
            return "'[' and ']' may only enclose an IP address as the host (elsewhere write %5B and %5D)"
        if not re.fullmatch(rf"{_IPV6}|[vV][0-9A-Fa-f]+\.[{_UNRESERVED_SUB_DELIMS}:]+", bracketed.group(1)):
            return "the host in '[' and ']' is no IPv6 address"
    authority = _AUTHORITY_OF.match(text)
    if authority is not None:
        host_port = authority.group(1).rpartition("@")[2]
        port = host_port.rpartition("]")[2] if host_port.startswith("[") else host_port
        if ":" in port and not port.rpartition(":")[2].isdigit():
            return "a port that is no number"
    first = re.split(r"[/?#]", text, maxsplit=1)[0]
    if ":" in first and not re.fullmatch(_SCHEME, first.partition(":")[0]):
        return (
            "a ':' in the first segment, after no scheme (a scheme starts with a letter, then letters, digits, "
            "'+', '-' or '.'; write ./ before a relative path holding ':')"
        )
    return "a character or part RFC 3986 does not allow there"
