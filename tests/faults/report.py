"""Turn the recorded fault verdicts into the table in docs/reliability.md.

``python -m tests.faults.report`` rewrites the part of the page between the
``<!-- results -->`` markers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.faults.conftest import RESULTS

DOC = Path("docs/reliability.md")
START, END = "<!-- results -->", "<!-- /results -->"


def table() -> str:
    """A Markdown table of every recorded scenario."""
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]
    lines = [
        "| scenario | mode | runs | events | lost | leaked | unexpected | duplicates | order | when | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: r["scenario"]):
        lines.append(
            f"| {r['scenario']} | {r['mode']} | {r['runs']} | {r['events']} | {r['lost']} | {r['leaked']} | "
            f"{r['unexpected']} | {r['duplicates']} | {r['order_violations']} | {r['at']} | {r['note']} |"
        )
    return "\n".join(lines)


def main() -> int:
    """Rewrite the results block of docs/reliability.md."""
    text = DOC.read_text() if DOC.exists() else f"# Reliability\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        print(f"{DOC} has no {START} ... {END} block", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{table()}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
