"""No module of the product over 450 lines: one concern per room (STYLE.md, "Shape"; issue 37, part 6).

A module that grows past the limit is split by concept, not cut in the middle.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("relay", "producers")
MAX_LINES = 450
#: Modules allowed past the limit while a branch shrinks them, each at most as long as it was: an entry
#: goes once its module is within the limit (the test below says when). None today.
ALLOWED: dict[str, int] = {}


def module_lines(root: Path = ROOT) -> dict[str, int]:
    """Every Python module of the product packages under ``root``, by path, with its number of lines."""
    return {
        path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def too_long(sizes: dict[str, int]) -> dict[str, int]:
    """The modules over their limit: ``MAX_LINES``, or an allowed module's own."""
    return {path: lines for path, lines in sizes.items() if lines > ALLOWED.get(path, MAX_LINES)}


def test_the_product_has_modules_to_measure() -> None:
    sizes = module_lines()
    assert "relay/__init__.py" in sizes
    assert "producers/__init__.py" in sizes
    assert len(sizes) > 50


def test_no_module_is_over_the_limit() -> None:
    assert too_long(module_lines()) == {}, f"split these by concept (at most {MAX_LINES} lines each)"


def test_every_allowance_is_still_needed() -> None:
    sizes = module_lines()
    stale = {path for path in ALLOWED if sizes.get(path, 0) <= MAX_LINES}
    assert not stale, f"these are within {MAX_LINES} lines now (or gone): drop them from ALLOWED"


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ({"relay/a.py": MAX_LINES}, {}),
        ({"relay/a.py": MAX_LINES + 1}, {"relay/a.py": MAX_LINES + 1}),
        ({"relay/b.py": 1, "relay/c.py": 10_000}, {"relay/c.py": 10_000}),
    ],
)
def test_the_limit_is_counted_as_stated(sizes: dict[str, int], expected: dict[str, int]) -> None:
    assert too_long(sizes) == expected
