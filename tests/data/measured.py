"""The decision page's tables of what the cleaning stage measures on the real files: the tests
that measure it read them from the page, so the page cannot drift from the measure."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "decisions" / "return-cleaning.md"


def doc_table(name: str) -> dict[tuple[str, str], str]:
    """(symbol, date) -> kind of a table of the decision page, the one under the line
    `<!-- measured: name -->`: the page names every return the stage leaves out (or misses) on
    the real files, and these tests keep it true."""
    lines = DOC.read_text().splitlines()
    start = lines.index(f"<!-- measured: {name} -->")
    rows: dict[tuple[str, str], str] = {}
    seen = False
    for line in lines[start + 1 :]:
        if not line.startswith("|"):
            if seen:
                break
            continue
        seen = True
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[1]):
            rows[(cells[0], cells[1])] = cells[2]
    return rows
