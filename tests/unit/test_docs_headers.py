"""The documented RabbitMQ header rules are the sink's: the reserved names and every example in the docs.

``docs/publishing.md`` once said every ``x-`` header was refused, while the
README and the sink forwarded them and refused only RabbitMQ's own names."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from relay.events import Event
from relay.sinks.rabbitmq.limits import RESERVED_HEADER_PREFIXES, RESERVED_HEADERS, refusal

ROOT = Path(__file__).resolve().parents[2]
RABBITMQ_PAGE = ROOT / "docs" / "rabbitmq.md"
DOCUMENTED = set(RESERVED_HEADERS) | set(RESERVED_HEADER_PREFIXES)
_ROW_RE = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(dead-lettered|forwarded)\s*\|\s*$")
_CODE_RE = re.compile(r"`([^`]+)`")


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _paragraph(text: str, words: str) -> str:
    """The paragraph of ``text`` holding ``words``, its lines joined by spaces."""
    found = [" ".join(p.split()) for p in text.split("\n\n") if words in " ".join(p.split())]
    assert len(found) == 1, f"{len(found)} paragraphs hold {words!r}"
    return found[0]


def _examples() -> list[tuple[str, str]]:
    section = _section(RABBITMQ_PAGE.read_text("utf-8"), "Headers")
    return [(m.group(1), m.group(2)) for line in section.splitlines() if (m := _ROW_RE.match(line))]


def _refused(name: str) -> bool:
    event = Event(1, "t", None, b"{}", {name: "v"}, "k", 0, datetime.now(UTC))
    return refusal(event, max_message_bytes=1 << 20) is not None


def test_the_docs_list_exactly_the_reserved_names_and_prefixes() -> None:
    listed = _paragraph(_section(RABBITMQ_PAGE.read_text("utf-8"), "Headers"), "The reserved names:")
    assert set(_CODE_RE.findall(listed)) == DOCUMENTED


def test_the_readme_lists_exactly_the_reserved_names_and_prefixes() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    listed = _paragraph(readme, "Headers that RabbitMQ reads itself")
    names = {name.removesuffix("*") for name in _CODE_RE.findall(listed) if name != "x-*"}
    assert names == DOCUMENTED
    assert "Every other header, `x-*` included, is forwarded." in listed


def test_the_examples_cover_every_reserved_name_and_prefix_and_both_outcomes() -> None:
    examples = dict(_examples())
    assert set(RESERVED_HEADERS) <= set(examples)
    assert all(any(name.startswith(prefix) for name in examples) for prefix in RESERVED_HEADER_PREFIXES)
    assert {"forwarded", "dead-lettered"} == set(examples.values())


@pytest.mark.parametrize(("name", "outcome"), _examples())
def test_each_documented_example_is_what_the_sink_does(name: str, outcome: str) -> None:
    assert _refused(name) == (outcome == "dead-lettered"), f"docs/rabbitmq.md says {name!r} is {outcome}"


@pytest.mark.parametrize("page", [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"], ids=lambda p: p.name)
def test_no_page_says_every_x_header_is_refused(page: Path) -> None:
    text = " ".join(page.read_text("utf-8").split())
    assert not re.search(r"(starting|beginning) with `x-`[^.]*(refus|dead-letter)", text), (
        f"{page.name} says x- headers are refused; only RabbitMQ's own names are (docs/rabbitmq.md#headers)"
    )
