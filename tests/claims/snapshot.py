"""What a rewrite of the claims' words must not change: every table's numbers and every
verdict, read from what `make report` wrote (experiments/*/table.md, the verdict blocks of
experiments/README.md). test_registry checks that `make report` rebuilds those files byte for
byte from the runs, so together with tests/claims/test_unchanged.py a change of code that moves
a number or a state fails.

    python tests/claims/snapshot.py > tests/claims/numbers.json   # the record, before a rewrite

Numbers: each data row of each markdown table on a table's page, as the numbers it holds
(signs dropped: a rewrite may turn "-1.2 pts" into "a gap of 1.2"). States: the state words
in each bold span of a page (a verdict, an answer), in each list item and in each table
row's last cell, and
every claim's verdict in experiments/README.md's blocks.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = re.compile(r"(?<![\w.])-?(\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w])")
IN_PROGRESS = ("recoverpilot", "recover")  # their runs are still coming in
STATES = ("not reproduced", "reproduced", "partly", "untestable", "not run yet", "breaks",
          "holds", "unclear", "not supported", "supported", "undecided", "disagrees", "agrees",
          "not higher", "higher", "not steady", "steady", "neither alone", "recovers",
          "no better", "diverged")


def states(text: str) -> list[str]:
    """The state words in `text`, longest first so "not reproduced" is not also
    "reproduced"."""
    found = []
    for s in STATES:
        n = len(re.findall(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text))
        found += [s] * n
        text = re.sub(rf"(?<![\w-]){re.escape(s)}(?![\w-])", " ", text)
    return sorted(found)


def tables(text: str) -> list[list[str]]:
    """The data rows (cells) of every markdown table in `text`: header and rule rows left
    out."""
    lines = text.splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("|") or re.fullmatch(r"\|[-| :]+\|", line):
            continue
        if i + 1 < len(lines) and re.fullmatch(r"\|[-| :]+\|", lines[i + 1]):
            continue  # a header
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def numbers(cells: list[str]) -> list[str]:
    return [m for c in cells for m in NUMBER.findall(c.replace("`", ""))]


def page(text: str) -> dict:
    rows = tables(text)
    return {"rows": [numbers(r) for r in rows],
            "states": sorted([s for r in rows for s in states(r[-1])]
                             + [s for b in re.findall(r"\*\*(.+?)\*\*", text) for s in states(b)]
                             + [s for li in re.findall(r"^- (.+)$", text, re.M)
                                for s in states(li)])}


def verdicts(readme: str) -> dict[str, str]:
    """Every claim's verdict in experiments/README.md's generated blocks."""
    out = {}
    for claim, verdict in re.findall(r"^\| ((?:C|L)\d+) \|.*\*\*([^*]+)\*\* \|", readme, re.M):
        out[claim] = verdict.replace(" (preliminary)", "")
    return out


def snapshot(experiments: Path = ROOT / "experiments") -> dict:
    return {"pages": {p.parent.name: page(p.read_text())
                      for p in sorted(experiments.glob("*/table.md"))
                      if p.parent.name not in IN_PROGRESS},
            "verdicts": verdicts((experiments / "README.md").read_text())}


if __name__ == "__main__":
    json.dump(snapshot(), sys.stdout, indent=0, ensure_ascii=False)
    sys.stdout.write("\n")
