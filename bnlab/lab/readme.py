"""The claims' verdicts written into experiments/README.md, and the headline's figures and
verdicts into the project's README.md, between their `<!-- name:begin/end -->` markers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from bnlab.errors import BnlabError
from bnlab.lab import rules
from bnlab.lab.page import budget_line, default_rate
from bnlab.lab.results import wall_minutes
from bnlab.lab.table import Finding, RunsData, Table, Verdict, claim_order, complete, nested
from bnlab.paths import EXPERIMENTS, ROOT, RUNS, shown


def replace_block(path: Path, begin: str, end: str, block: str) -> None:
    """Put `block` (which starts with `begin` and ends with `end`) in place of the text
    between those markers in `path`, or append it."""
    text = path.read_text() if path.is_file() else "# experiments\n"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    path.write_text(head + block + rest.split(end, 1)[1])


def claim_rows(vs: list[Verdict], sweeping: bool = False) -> list[str]:
    """The claims' markdown table; while `sweeping`, each decided verdict that seeds still to
    come could change is marked preliminary."""
    rows = ["| claim | command | claimed | ours | verdict | why |", "|---|---|---|---|---|---|"]
    for v in vs:
        verdict = v.verdict + v.mark(sweeping)
        rows.append(f"| {v.claim} | `{v.command}` | {v.claimed} | {v.ours} | **{verdict}** "
                    f"| {v.why} |")
    return rows


def write_verdicts(readme: Path, marker: str, built: list[tuple[Table, Any]],
                   every: list[tuple[Table, Any]] | None = None) -> None:
    """The verdicts of the tables in `built` between `<!-- marker:begin/end -->` of `readme`,
    in the claims' order. Where the tables are sweeps, the block also says how many of their
    runs have finished (verdicts are preliminary until all have) and their wall time together
    against the budget. The headline's findings and figures come from `every` table built
    (default: `built`)."""
    if not any(t.claims for t, _ in built):
        return  # history: tables kept for their numbers, whose claims are ruled elsewhere
    ruled = [(t, v) for t, d in built for v in t.verdicts(d)]  # each table's rules run once
    verdicts = sorted((v for _, v in ruled), key=claim_order)
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    sweeps = [d for _, d in built if isinstance(d, RunsData)]
    if not sweeps:
        replace_block(readme, begin, end, "\n".join([begin, *claim_rows(verdicts), end]))
        return
    cells = [c for d in sweeps for c in d.cells]  # shared cells: count runs once
    done = len({r.path for c in cells for r in c.runs})
    expected = len({(c.cell.key, s) for c in cells for s in c.cell.seeds})
    unique = {c.cell.key: c for c in cells}.values()
    short = sum(len(c.runs) < c.expected for c in unique)
    n = ("one", "two", "three", "four", "five", "six")[len(sweeps) - 1]
    going = [t for t, d in built if isinstance(d, RunsData) and not complete(*d.cells)] or \
        [t for t, d in built if isinstance(d, RunsData)]  # the tables still short of seeds
    again = "`make tables`" if marker == "claims" else ", ".join(f"`{t.make}`" for t in going)
    tables = "the table calls" if len(sweeps) == 1 else f"the {n} tables call"
    marked = any(v.mark(True) for v in verdicts)
    waiting = any(v.verdict == "not run yet" for v in verdicts)
    which = " and ".join(x for x, there in (
        ("the verdicts marked preliminary may change", marked),
        ("those not run yet wait for their runs", waiting)) if there)
    status = "" if done == expected else (
        f"**Preliminary:** {done} of the {expected} runs {tables} for have "
        f"finished ({short} of {len(unique)} cells lack seeds); the sweep goes on with "
        f"{again}, and " + (f"{which} (the others have every seed their rules read). " if which
                            else "only the findings may change: every verdict has every seed "
                            "its rule reads. "))
    runs = [r for c in cells for r in c.runs]
    settings = {(s.jobs, s.budget("all")) for s in sweeps}
    if len(settings) > 1:   # one wall-time sentence for the block: its tables must agree
        raise BnlabError(f"the tables behind {marker}'s verdicts disagree on `jobs:` or "
                         f"`budget: all:` ({sorted(settings, key=str)}); make their sweep.yaml "
                         "files agree.")
    (jobs, cap), = settings
    if cap is not None:  # the three short-protocol sweeps had a budget together: `make tables`
        budget = (f"Wall time of all {n} tables together (`make tables`, shared cells run "
                  f"once): {budget_line(runs, expected, cap, jobs)}; each table gives its own.")
    else:
        these = "this table" if len(sweeps) == 1 else f"these {n} tables together"
        budget = (f"Wall time of the runs of {these} (shared cells run once): "
                  f"about {wall_minutes(runs, jobs):.0f} min at {jobs} runs side by side on this "
                  f"machine, for the {done} of {expected} runs finished.")
    replace_block(readme, begin, end, "\n".join([
        begin, f"{status}Generated by `make report` from the runs in "
        f"`{shown(sweeps[0].root)}/{sweeps[0].tag}/`; each rule is written in "
        "`experiments/<table>/rules.yaml` (the settled tables) or beside its table in "
        "`bnlab/claims/<table>.py`.", "",
        *claim_rows(verdicts, done != expected), "", budget, end]))
    print(f"wrote the claims' verdicts into {readme}")
    # the block whose tables have a headline figure (the settled one) also opens README.md
    if any(t.headline for t, _ in built) and \
            readme.resolve() == (EXPERIMENTS / "README.md").resolve() and \
            all(d.root.resolve() == RUNS.resolve() for d in sweeps):  # the committed runs
        found = headline_findings([f for t, d in (every or built) if t.finding
                                   for f in t.finding(d)])
        figures = shown_figures([t for t, _ in (every or built)], found)
        marks = {v.claim: rules.mark(rules.read(t.rules)) for t, v in ruled if t.rules}
        write_headline(ROOT / "README.md", figures, verdicts, status, tuple(found), marks)
        write_json(HEADLINE, verdicts, status, tuple(found), data_tags(every or built))


def headline_findings(findings: list[Finding]) -> list[Finding]:
    """The findings the README lists: by rank, each set under the table it extends, those of a
    replaced table left out (nested), the highest-ranked FINDINGS of them."""
    return nested(sorted(findings, key=lambda f: f.rank))[:FINDINGS]


def shown_figures(tables: list[Table], found: list[Finding]) -> list[str]:
    """The headline figures the README shows: every table's, less those of tables another
    shown finding replaces, and of tables whose figure waits for their finding
    (`headline_told`) while it is not shown."""
    told = {f.table for f in found}
    gone = {t for f in found for t in f.replaces}
    return [f"experiments/{t.name}/{t.headline}" for t in tables
            if t.headline and t.name not in gone and (t.name in told or not t.headline_told)]


# the README's first screen reads in a minute: its highest-ranked findings only (the others
# stay on their tables' pages)
FINDINGS = 5
HEADLINE = EXPERIMENTS / "headline.json"  # the headline's verdicts for make demo to quote


def data_tags(built: list[tuple[Table, Any]]) -> list[str]:
    """The data tags (`<name>-<training images>`) of the sweeps behind the headline: what the
    README and the demo say the findings were trained on."""
    return sorted({d.tag for _, d in built if isinstance(d, RunsData)})


def write_json(path: Path, verdicts: list[Verdict], status: str,
               findings: tuple[Finding, ...], data: list[str]) -> None:
    """The headline's verdicts in a few words, the tables' findings and the data tags of their
    runs (`data`), as data (read by `make demo`, which cannot afford to rebuild them from the
    runs, and by the tests that set a table's coming finding among them and check the README's
    words on the data)."""
    tmp = path.with_name(f".{path.name}.tmp")  # whole or not at all: make demo may read it
    tmp.write_text(json.dumps({
        "preliminary": bool(status),
        "data": data,
        "verdicts": [{"claim": v.claim, "claimed": v.claimed, "ours": v.short,
                      "verdict": v.verdict, "final": v.final} for v in verdicts],
        "findings": [{"text": f.text, "table": f.table, "mark": f.mark, "rank": f.rank,
                      "after": f.after,
                      "under": [{"text": u.text, "table": u.table, "mark": u.mark}
                                for u in f.under]}
                     for f in findings]}, indent=1,
        ensure_ascii=False) + "\n")
    tmp.replace(path)


# the words the findings may use, each defined before the first of them where the README's
# first screen uses it: (what marks its use, lower case; the definition)
TERMS = (
    (" x ", "4 x 2: 4 ranks (GPUs) of 2 images each (`batch_per_gpu=2`)."),
    ("input", "Input: a model at an image size."),
    ("plateau", "Plateau: training's second half."),
    ("jitter", "Jitter: val accuracy's moves between evaluations, trend removed (von Neumann "
               "sd)."),
    (" stead", "Steady: jitter at most 1.5x the churn floor, what test-set flips alone give."),
    (" values", "Values: how many numbers a BN layer averages per channel on one rank."),
    ("bn's loss", "Share of BN's loss against 1 x 8: what a fix wins back; states: recovers "
                  f"(within {rules.read('recover')['recovers_gap']:g} points), partly, no "
                  "better, unclear (seeds cannot tell)."),
    ("pilot", "Pilot: held-out runs choosing a setting."),
    ("default", f"Default rate: {default_rate():g} at 4 x 2."),
    ("+ws", "WS: Weight Standardization."),
    ("†", "†: a rule written after its data."),
)
# the reference a share of BN's loss is measured against: 1 x 8 (table-recover's), 8 x 16
# (table-practice's, at 8 ranks) where the line holding the share says so, or both
SHARE = "Share of BN's loss against 1 x 8"
AGAINST = {(True, False): SHARE, (False, True): "Share of BN's loss against 8 x 16",
           (True, True): "Share of BN's loss against the reference (1 x 8; 8 x 16 at 8 ranks)"}


def terms(findings: tuple[Finding, ...] = (), rest: str = "") -> str:
    """The terms line: each term that the findings, the lines under them, the sentences below
    the list, `rest` (the verdict table) or a definition kept for them use; "" where none."""
    # one line each, each opening with a space: a term's mark may open a line (" x ", " values")
    said = "\n ".join([rest, *(f.after for f in findings),
                       *(x.text + x.mark for f in findings for x in (f, *f.under))]).lower()
    kept: list[str] = []
    while True:  # a kept definition may use another term (the default rate: 4 x 2)
        now = [d for mark, d in TERMS if mark in " ".join([said, *kept]).lower()]
        if now == kept:
            break
        kept = now
    line = ("Terms: " + " ".join(kept)) if kept else ""
    # a line that names its share's reference ("against 1 x 8") needs none from this line,
    # which then says that a line may name its own
    every = [ln for ln in said.splitlines() if "bn's loss" in ln]
    shares = [ln for ln in every if "against 1 x 8" not in ln]
    against = (any("8 x 16" not in ln for ln in shares), any("8 x 16" in ln for ln in shares))
    if not any(against):
        return line
    unless = " unless said" if against == (False, True) and len(shares) < len(every) else ""
    return line.replace(SHARE, AGAINST[against] + unless)


def prose(text: str) -> list[str]:
    """The README's findings section ("## What it found" to the next heading) as its word
    budget counts it: the lines outside tables, figures and markers, each link's target dropped
    (a link's target is no prose); the terms line first."""
    section = text.split("## What it found")[1].split("\n## ")[0]
    return [re.sub(r"\]\([^)]*\)", "]", ln) for ln in section.splitlines()
            if ln.strip() and not ln.startswith(("|", "![", "<!--"))]


def write_headline(path: Path, figures: list[str], verdicts: list[Verdict], status: str,
                   findings: tuple[Finding, ...] = (), marks: dict[str, str] | None = None
                   ) -> None:
    """What bnlab found, first screen: the findings numbered, one sentence each, then the
    headline tables' figures, then the claims' verdicts in a few words, in `path` (the project's
    README.md) between `<!-- headline:begin/end -->`. `marks`: per claim, the link to its
    table's rules history where a rule behind it was written after its data were seen; the
    statistics and the disclosures stay on the tables' pages and in experiments/README.md."""
    begin, end = "<!-- headline:begin -->", "<!-- headline:end -->"
    text = path.read_text() if path.is_file() else ""
    if begin not in text or end not in text:
        raise BnlabError(f"{path} lacks the lines {begin} and {end} that the headline goes "
                         "between; put them back where the headline belongs.")
    marks = marks or {}
    rows = ["| claim | claimed | ours | verdict |", "|---|---|---|---|"]
    rows += [f"| {v.claim} | {v.claimed} | {v.short} | "
             f"**{v.verdict}{v.mark(bool(status))}**{marks.get(v.claim, '')} |"
             for v in verdicts]
    dagger = any(marks.values()) or any(x.mark for f in findings for x in (f, *f.under))
    replace_block(path, begin, end, "\n".join([
        begin, *([defined, ""] if (defined := terms(findings, "\n".join(rows))) else []),
        *(f"{i}. {f.line()}" for i, f in enumerate(findings, 1)), "",
        *(x for f in findings if f.after for x in (f.after, "")),
        *(f"![{Path(f).stem}]({f})" for f in figures), "",
        f"{status}The claims' verdicts follow" + (
            " (†: a rule written after its data were seen)" if dagger and "†" not in
            defined else "")  # the legend once: in the terms line where it has one
        + "; how each was measured: [experiments/README.md](experiments/README.md).", "",
        *rows, end]))
