"""The documentation site: the generated CLI page is current, the site builds, links resolve."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATOR = DOCS / "gen_cli_reference.py"
CLI_PAGE = DOCS / "reference" / "cli.md"
BUILD_TIMEOUT_SECONDS = 240

_FENCE_RE = re.compile(r"^[ \t]*(```|~~~)")
_CODE_SPAN_RE = re.compile(r"(`+).+?\1")
_INLINE_LINK_RE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_RE = re.compile(r"^[ \t]*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli_reference", GENERATOR)
    assert spec is not None and spec.loader is not None, f"cannot load {GENERATOR}"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _render() -> str:
    render: Callable[[], str] = _generator().render
    return render()


def link_targets(markdown: str) -> Iterator[str]:
    """Every link target in ``markdown`` outside code blocks and code spans."""
    fence: str | None = None
    for line in markdown.splitlines():
        opening = _FENCE_RE.match(line)
        if fence is not None:
            if opening and opening.group(1) == fence:
                fence = None
            continue
        if opening:
            fence = opening.group(1)
            continue
        text = _CODE_SPAN_RE.sub("", line)
        yield from _INLINE_LINK_RE.findall(text)
        yield from _REFERENCE_RE.findall(text)


def _relative(target: str) -> str | None:
    """The file part of a relative link, or None for URLs and same-page anchors."""
    if _SCHEME_RE.match(target) or target.startswith(("#", "/")):
        return None
    return target.split("#", 1)[0].split("?", 1)[0] or None


def test_cli_reference_is_up_to_date() -> None:
    expected = _render()
    current = CLI_PAGE.read_text("utf-8") if CLI_PAGE.exists() else ""
    assert current == expected, (
        "docs/reference/cli.md does not match the CLI; regenerate it with `python docs/gen_cli_reference.py`"
    )


def test_cli_reference_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = _render()
    monkeypatch.setenv("RELAY_BATCH_SIZE", "7")
    monkeypatch.setenv("RELAY_TABLE", "events.elsewhere")
    monkeypatch.setenv("DATABASE_URL", "postgresql://someone:secret@db/x")
    assert _render() == clean
    assert os.environ["RELAY_BATCH_SIZE"] == "7", "the generator must restore the environment"


def test_cli_reference_covers_every_command_and_flag() -> None:
    page = _render()
    for command in ("migrate", "run", "status", "dead", "requeue", "skip"):
        assert f"\n## {command}\n" in page
    for flag, env in (("--sink URL", "RELAY_SINK"), ("--batch-size", "RELAY_BATCH_SIZE"), ("--listen", "RELAY_LISTEN")):
        row = next((line for line in page.splitlines() if line.startswith(f"| `{flag}")), None)
        assert row is not None, f"no row for {flag}"
        assert f"`{env}`" in row


def test_link_targets_skip_code() -> None:
    text = "\n".join(
        [
            "See [a](a.md#x), ![img](img/p.png) and [web](https://example.com).",
            "`[not](code.md)` is code.",
            "```text",
            "[neither](fenced.md)",
            "```",
            "    ```go",
            "    [nor](indented-fence.md)",
            "    ```",
            '[ref]: ref.md "title"',
        ]
    )
    assert list(link_targets(text)) == ["a.md#x", "img/p.png", "https://example.com", "ref.md"]
    assert [_relative(t) for t in link_targets(text)] == ["a.md", "img/p.png", None, "ref.md"]


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(DOCS)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in link_targets(page.read_text("utf-8")):
        path = _relative(target)
        if path is not None and not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


@pytest.mark.timeout(BUILD_TIMEOUT_SECONDS + 60)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (or '.[dev]')", pytrace=False)
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    # The custom fence turns the state diagram into a Mermaid block, not a code listing.
    assert '<pre class="mermaid">' in (site / "how-it-works" / "index.html").read_text("utf-8")


def _nav_pages(entries: object) -> Iterator[str]:
    """Every page file in an mkdocs ``nav`` (nested sections included)."""
    if isinstance(entries, str):
        yield entries
    elif isinstance(entries, list):
        for entry in entries:
            yield from _nav_pages(entry)
    elif isinstance(entries, dict):
        for value in entries.values():
            yield from _nav_pages(value)


def _site_pages() -> set[str]:
    return {str(page.relative_to(DOCS)) for page in DOCS.rglob("*.md")}


def _mkdocs_nav() -> object:
    import yaml

    class Loader(yaml.SafeLoader):
        """mkdocs.yml's ``!!python/name:`` tags read as plain text: only the nav matters here."""

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text("utf-8"), Loader=Loader)
    return config["nav"]


def test_every_page_is_linked_from_the_index() -> None:
    linked = {_relative(target) for target in link_targets((DOCS / "index.md").read_text("utf-8"))}
    missing = sorted(_site_pages() - {"index.md"} - linked)
    assert not missing, f"docs/index.md links no page {missing}: a reader of the site cannot find them"


def test_every_page_is_in_the_mkdocs_nav_and_every_nav_entry_exists() -> None:
    nav = list(_nav_pages(_mkdocs_nav()))
    assert len(nav) == len(set(nav)), f"a page is twice in the nav: {nav}"
    assert set(nav) == _site_pages(), {
        "not in the nav": sorted(_site_pages() - set(nav)),
        "no such page": sorted(set(nav) - _site_pages()),
    }


@pytest.mark.parametrize(
    "task", ["getting-started.md", "publishing.md", "running.md", "consuming.md", "operations.md", "upgrading.md"]
)
def test_each_task_has_a_page_the_index_leads_to(task: str) -> None:
    index = (DOCS / "index.md").read_text("utf-8")
    assert f"]({task})" in index


#: The pages a team adopts from: short paragraphs (the longest in docs/ordering.md once ran to 420 words).
TASK_PAGES = [
    "index.md",
    "getting-started.md",
    "publishing.md",
    "running.md",
    "consuming.md",
    "upgrading.md",
    "kafka.md",
    "rabbitmq.md",
]
PARAGRAPH_MAX_WORDS = 170
_BLOCK_START_RE = re.compile(r"^\s*([-*+]|\d+\.)\s|^\s*(#|\||!!!)")


def paragraphs(markdown: str) -> Iterator[str]:
    """The prose paragraphs of ``markdown``: list items and their paragraphs count one by one; code, tables
    and headings are left out."""
    lines: list[str] = []
    fence: str | None = None
    for line in [*markdown.splitlines(), ""]:
        opening = _FENCE_RE.match(line)
        if fence is not None:
            if opening and opening.group(1) == fence:
                fence = None
            continue
        if opening or not line.strip() or _BLOCK_START_RE.match(line):
            if lines:
                yield " ".join(" ".join(lines).split())
            lines = []
            if opening:
                fence = opening.group(1)
            elif _BLOCK_START_RE.match(line) and not line.lstrip().startswith(("#", "|", "!!!")):
                lines = [line]
            continue
        lines.append(line)


def test_paragraphs_splits_items_and_skips_code_and_tables() -> None:
    text = "One two.\nThree.\n\n- item a\n  more\n- item b\n\n```\ncode here\n```\n| a | b |\n# Head\nlast"
    assert list(paragraphs(text)) == ["One two. Three.", "- item a more", "- item b", "last"]


@pytest.mark.parametrize("page", TASK_PAGES)
def test_task_pages_have_short_paragraphs(page: str) -> None:
    long = [p[:60] for p in paragraphs((DOCS / page).read_text("utf-8")) if len(p.split()) > PARAGRAPH_MAX_WORDS]
    assert not long, f"docs/{page} has paragraphs over {PARAGRAPH_MAX_WORDS} words: {long}"
