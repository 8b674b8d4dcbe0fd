"""--event-source against RFC 3986's URI-reference grammar: families of references taken, of near misses refused."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from relay.config import check_event_source
from relay.errors import ConfigError
from relay.uri_reference import IPV6_ADDRESS, is_uri_reference

UNRESERVED = "abcxyzABCXYZ0189-._~"
SUB_DELIMS = "!$&'()*+,;="
PCT = st.sampled_from(["%2F", "%3a", "%C3%A9", "%25", "%00"])
PCHAR = st.one_of(st.sampled_from(UNRESERVED + SUB_DELIMS + ":@"), PCT)
SEGMENT = st.lists(PCHAR, max_size=6).map("".join)
PATH = st.lists(SEGMENT, max_size=4).map(lambda parts: "".join("/" + p for p in parts))
QUERY = st.lists(st.one_of(PCHAR, st.sampled_from("/?")), max_size=8).map("".join)
SCHEME = st.from_regex(r"[A-Za-z][A-Za-z0-9+\-.]{0,6}", fullmatch=True)
HOST = st.one_of(
    st.from_regex(r"[a-z0-9\-.]{0,12}", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a.compressed}]"),
    st.ip_addresses(v=6).map(lambda a: f"[{a.exploded}]"),
    st.just("[v7.fe:80]"),
)
PORT = st.one_of(st.just(""), st.integers(0, 65535).map(lambda p: f":{p}"))
TAIL = st.tuples(st.one_of(st.just(""), QUERY.map("?".__add__)), st.one_of(st.just(""), QUERY.map("#".__add__)))


@st.composite
def uri_references(draw: st.DrawFn) -> str:
    """A URI-reference as RFC 3986 builds one: with a scheme or without, an authority or a path."""
    form = draw(st.sampled_from(["authority", "absolute", "rootless", "relative"]))
    if form == "authority":
        # No '@' past the host and no fragment: there the relay takes them for a password cut by a
        # raw '/', '?' or '#' (relay.secrets.ambiguity) and refuses the source, on purpose.
        head = draw(st.one_of(st.just(""), SCHEME.map(lambda s: s + ":")))
        query = draw(st.one_of(st.just(""), QUERY.map("?".__add__)))
        return f"{head}//{draw(HOST)}{draw(PORT)}{draw(PATH)}{query}".replace("@", "%40")
    elif form == "absolute":
        # A first segment, if any, is not empty: '//' would start an authority.
        rest = draw(st.one_of(st.just(""), st.tuples(SEGMENT.filter(bool), PATH).map("".join)))
        body = draw(st.one_of(st.just(""), SCHEME.map(lambda s: s + ":"))) + "/" + rest
    elif form == "rootless":  # urn:shop:orders (a first segment, not empty, or it is one of the above)
        body = f"{draw(SCHEME)}:{draw(SEGMENT.filter(bool))}{draw(PATH)}"
    else:  # a relative path: no ':' in its first segment, and only the empty reference has none
        body = draw(st.one_of(st.just(""), st.tuples(SEGMENT.filter(bool), PATH).map("".join)))
        body = body.replace(":", "%3A")
    query, fragment = draw(TAIL)
    return body + query + fragment


@given(uri_references())
@example("/shop/orders")
@example("urn:shop:orders")
@example("https://[::ffff:192.0.2.1]:8080/orders?x=[%5B]".replace("[%5B]", "%5B"))
@example("./a:b")
def test_every_uri_reference_is_taken(text: str) -> None:
    if not text:
        return  # an empty one is refused as empty, which says more
    assert is_uri_reference(text)
    assert check_event_source(text) == text


NEAR_MISSES = [
    # non-ASCII: an IRI, not a URI
    ("/café", "not ASCII"),
    ("urn:shop:ördersü", "not ASCII"),
    ("https://shop.example/orders?q=\u2603", "not ASCII"),
    ("https://bücher.example/", "not ASCII"),
    # '%' not followed by two hex digits
    ("/a%zz", "percent-encoding of two hex digits"),
    ("/a%4", "percent-encoding of two hex digits"),
    ("/100%", "percent-encoding of two hex digits"),
    ("urn:x:%G0", "percent-encoding of two hex digits"),
    ("/a?q=%", "percent-encoding of two hex digits"),
    # a second '#'
    ("/a#b#c", "a second '#'"),
    ("urn:x#frag#", "a second '#'"),
    ("##", "a second '#'"),
    # '[' or ']' outside an IP-literal host
    ("/a[b]", "'[' and ']' may only enclose"),
    ("https://h/x?list=[1,2]", "'[' and ']' may only enclose"),
    ("urn:[x]", "'[' and ']' may only enclose"),
    ("/x#]", "'[' and ']' may only enclose"),
    ("https://h]/x", "'[' and ']' may only enclose"),
    ("http://[bad", "'[' and ']' may only enclose"),
    ("https://[zz::1]/x", "no IPv6 address"),
    ("https://[1:2:3:4:5:6:7:8:9]/x", "no IPv6 address"),
    ("https://[fe80::1%25eth0]/x", "no IPv6 address"),  # a zone (RFC 6874) is no part of RFC 3986
    # and a port that is no number, or too large for one
    ("https://h:8o/x", "a port that is no number"),
    ("//h:x", "a port that is no number"),
    ("https://[::1]:p/x", "a port that is no number"),
    ("https://[::1::2]/x", "no IPv6 address"),
    ("https://[1.2.3.4]/x", "no IPv6 address"),
    # a ':' in the first segment without a valid scheme
    ("1abc:def", "after no scheme"),
    ("a_b:c", "after no scheme"),
    (":x", "after no scheme"),
    ("-x:/y", "after no scheme"),
    ("sh op:x".replace(" ", "~"), "after no scheme"),
]


@pytest.mark.parametrize(("text", "needle"), NEAR_MISSES)
def test_a_near_miss_is_refused_in_one_line_naming_the_problem(text: str, needle: str) -> None:
    assert not is_uri_reference(text)
    with pytest.raises(ConfigError, match=re.escape(needle)) as caught:
        check_event_source(text)
    assert "\n" not in str(caught.value)


def test_a_port_past_65535_is_refused_though_the_grammar_takes_it() -> None:
    # RFC 3986 allows any digits; no TCP port is that large.
    assert is_uri_reference("https://h:65536/x")
    with pytest.raises(ConfigError, match="a port past 65535"):
        check_event_source("https://h:65536/x")


@given(uri_references(), st.data())
def test_any_near_miss_spliced_into_a_reference_is_refused(text: str, data: st.DataObject) -> None:
    flaw = data.draw(
        # Each is wrong wherever it lands ('%4%': the text after it cannot complete the first '%').
        st.sampled_from(["é", "\u2603", "%g1", "%4%", "#a#", "[", "]", "[x]"]),
    )
    at = data.draw(st.integers(0, len(text)))
    spoiled = text[:at] + flaw + text[at:]
    assert not is_uri_reference(spoiled)
    with pytest.raises(ConfigError, match=r"invalid --event-source|user or password|empty"):
        check_event_source(spoiled)


@given(st.ip_addresses(v=6))
def test_every_ipv6_address_in_every_spelling_is_one(address: ipaddress.IPv6Address) -> None:
    for spelling in {address.compressed, address.exploded, address.compressed.upper()}:
        assert IPV6_ADDRESS.fullmatch(spelling), spelling


@given(st.text(alphabet="0123456789abcdef:.", max_size=45))
@example("1:2:3:4:5:6:7::")
@example("::1:2:3:4:5:6:7")
@example("1:2:3:4:5:6:7:8::")
@example("::01.2.3.4")
@example("::1.2.3.256")
def test_the_ipv6_grammar_agrees_with_ipaddress(text: str) -> None:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        valid = False
    else:
        valid = True
    assert bool(IPV6_ADDRESS.fullmatch(text)) == valid
