"""One reported table: the `Table` type, where it reads and writes (`Context`), its verdicts,
and table.md and its PNG built from what it loads.

Each module of bnlab/claims/ exports one `Table`; `make table-<name>` runs
`bnlab/claims/<name>.py` and writes `experiments/<name>/` (the command line: bnlab.lab.make;
the verdict blocks of the READMEs: bnlab.lab.readme; the lines of a page: bnlab.lab.page).
This module never imports bnlab.claims.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bnlab.errors import BnlabError
from bnlab.lab import identity
from bnlab.lab.page import column_terms, provenance
from bnlab.lab.plan import Spec
from bnlab.lab.results import CellResult, collect
from bnlab.lab.spec import load_spec, read_data_tag
from bnlab.paths import BENCH_RESULTS, EXPERIMENTS, MEASURED, RUNS, shown

# ----------------------------------------------------------------------------------------
# The verdict of a claim


@dataclass
class Verdict:
    claim: str
    command: str
    claimed: str
    ours: str
    verdict: str       # reproduced | partly | not reproduced | not run yet
    why: str
    glance: str = ""   # `ours` in a few words, for the project README's first screen
    final: bool = False  # no seed still to come can change it (else preliminary while a sweep
    # that the tables call for is unfinished)

    @property
    def short(self) -> str:
        return self.glance or self.ours

    def mark(self, sweeping: bool) -> str:
        """' (preliminary)' while a sweep goes on and seeds still to come could change it."""
        return " (preliminary)" if sweeping and not self.final and \
            self.verdict != "not run yet" else ""


@dataclass(frozen=True)
class Finding:
    """One thing a table found, for the README's first screen and the demo's last lines: one
    plain sentence with its number and interval, the table it comes from, and a mark linking
    the table's rules history where a rule behind it was written after its data were seen."""

    text: str
    table: str       # the table's name: experiments/<table>/table.md
    mark: str = ""   # bnlab.lab.rules.mark: " [†](experiments/<table>/table.md#...)" or ""
    # its place in the README's list, the answer users asked for first; each table's finding
    # its own rank, so the order never rests on the order the tables are listed in
    rank: int = 9
    # a plain sentence set under the list, where this finding and another read differently
    after: str = ""
    # another table's name: this sentence is set under that table's finding, as one of its
    # parts (a second table answering the same question on another protocol), not numbered
    extends: str = ""
    # tables whose findings this one stands in for (a later table answering their question at
    # a scale they did not reach): theirs leave the README, their pages stay; a finding of such
    # a table that extends this one's is kept, set under it
    replaces: tuple[str, ...] = ()
    under: tuple[Finding, ...] = ()  # the sentences set under it (nested() fills them)

    def line(self) -> str:
        """The README's form: the sentence, its table linked, its mark; those set under it
        indented below, one a line."""
        return "\n".join([f"{self.text} ([table-{self.table}](experiments/{self.table}/"
                          f"table.md)){self.mark}", *(f"   - {u.line()}" for u in self.under)])


def nested(findings: list[Finding]) -> list[Finding]:
    """The findings with each one that `extends` another table's set under that table's first
    finding (dropped where that table has none), in order; those of a table another finding
    `replaces` left out, unless they extend the replacing table."""
    by = {t: f.table for f in findings for t in f.replaces}
    findings = [f for f in findings if f.table not in by or f.extends == by[f.table]]
    tops = [f for f in findings if not f.extends]
    first = {f.table: i for i, f in reversed(list(enumerate(tops)))}
    return [replace(f, under=f.under + tuple(u for u in findings if u.extends == f.table))
            if first[f.table] == i else f for i, f in enumerate(tops)]


def complete(*cells) -> bool:
    """Every seed the spec asks of each cell has ended (completed or diverged)."""
    return all(c is not None and len(c.runs) >= c.expected for c in cells)


def claim_order(v: Verdict) -> tuple[str, int]:
    """C1 .. C13, then L1, L2: the claims' own order."""
    m = re.fullmatch(r"([A-Z]+)(\d+)", v.claim)
    return (m[1], int(m[2])) if m else (v.claim, 0)


# ----------------------------------------------------------------------------------------
# The table type


@dataclass(frozen=True)
class Table:
    """One reported table: `make <target>` -> bnlab/claims/<name>.py -> experiments/<name>/.

    `load` reads what the table is built from (its runs, its results.json), `render` writes
    table.md from it, `verdicts` rules on its claims by the rules written beside it, `plot`
    draws experiments/<name>/<name>.png. `measure` is what the target measures beyond
    training (on checkpoints, in gloo processes); it is kept in `saved`, which `--report`
    reads back.
    """

    name: str
    claims: tuple[str, ...]
    load: Callable[[Context], Any]
    render: Callable[[Any], str]
    verdicts: Callable[[Any], list[Verdict]]
    plot: Callable[[Any, Path], None] | None = None
    measure: Callable[[Context], dict] | None = None
    saved: str = "results.json"
    block: str = ""      # the README markers its verdicts go between; default: its claim
    target: str = ""     # default: table-<name>
    spec: Path | None = None  # the sweep it trains; default: experiments/<name>/sweep.yaml
    headline: str = ""   # a figure (experiments/<name>/...): its block also opens README.md
    headline_told: bool = False  # that figure shown only while its finding is on the README
    finding: Callable[[Any], list[Finding]] | None = None  # the README's findings from it
    rules: str = ""      # experiments/<rules>/rules.yaml: the mark on its verdicts
    also: Callable[[Any, Path], None] | None = None  # other outputs into experiments/<name>/

    @property
    def make(self) -> str:
        return f"make {self.target or 'table-' + self.name}"

    @property
    def generated(self) -> str:
        """The start of table.md's line that names where the table comes from."""
        return generated_by(self.name, self.make)

    @property
    def marker(self) -> str:
        return self.block or self.claims[0].lower()

    @property
    def spec_path(self) -> Path:
        return self.spec or EXPERIMENTS / self.name / "sweep.yaml"

    @property
    def trains(self) -> bool:
        """The table needs runs of its own sweep spec."""
        return self.spec_path.is_file()


@dataclass
class Context:
    """Where one table reads and writes, and how its runs are made."""

    table: Table
    experiments: Path = EXPERIMENTS  # experiments/<name>/ and README.md are written here
    runs: Path = RUNS                # the run directories, by data tag
    tag: str | None = None           # the data tag; default: the only one under `runs`
    data: str | None = None          # --data: CIFAR-10 read from here, never downloaded
    here: bool = True                # its runs train on this machine (False: on SLURM)
    _spec: Spec | None = field(default=None, repr=False)

    @property
    def out(self) -> Path:
        return self.experiments / self.table.name

    @property
    def readme(self) -> Path:
        return self.experiments / "README.md"

    def spec(self) -> Spec:
        if self._spec is None:
            self._spec = load_spec(self.table.spec_path, self.data, here=self.here)
        return self._spec

    def run_tag(self) -> str:
        if self.tag is None:
            self.tag = default_tag(self.runs)
        return self.tag

    def cells(self) -> list[CellResult]:
        return collect(self.spec(), self.run_tag(), self.runs)

    def results(self) -> dict:
        """What the table measured (its `saved` file)."""
        path = self.out / self.table.saved
        if not path.is_file():
            raise BnlabError(f"no {path}; run `{self.table.make}` first.")
        return json.loads(path.read_text())


def generated_by(name: str, make: str) -> str:
    """`Generated by `make table-X` (`python -m bnlab.claims X`)`: the command and the module."""
    return f"Generated by `{make}` (`python -m bnlab.claims {name}`)"


def default_tag(root: Path = RUNS) -> str:
    tags = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if len(tags) != 1:
        raise BnlabError(f"{shown(root)} holds {len(tags)} data tags ({', '.join(tags)}); "
                         "pick one with --tag.")
    return tags[0]


# ----------------------------------------------------------------------------------------
# Tables built from a sweep's runs


@dataclass
class RunsData:
    """A sweep table's runs read back."""

    spec: Spec
    cells: list[CellResult]
    tag: str
    root: Path
    out: Path

    @property
    def jobs(self) -> int:
        """The runs side by side its wall time is stated at (the spec's `jobs:`)."""
        return self.spec.extra.get("jobs", 1)

    def budget(self, scope: str) -> int | None:
        """The spec's wall-time budget in minutes for `scope`: "target" (this table) or "all"
        (`make tables`); None where its spec sets none."""
        return (self.spec.extra.get("budget") or {}).get(scope)

    @property
    def by_label(self) -> dict[str, CellResult]:
        return {c.cell.label: c for c in self.cells}

    @property
    def trained_on(self) -> int:
        """Training images: the data tag's count (lab.spec.data_tag: `<name>-<images>`)."""
        return read_data_tag(self.tag)[1]

    @property
    def tested_on(self) -> int | None:
        """Images in the split evaluated: the labels a run saved (predictions.jsonl); None
        where no run saved them."""
        return next((len(r.predictions[0]) for c in self.cells for r in c.runs
                     if r.predictions), None)


@dataclass
class Pending:
    """A table whose spec is written later, from a pilot's choices: its runs once the spec
    exists, else why it waits."""

    runs: RunsData | None
    waiting: str = ""


def pending(ctx: Context, why: str) -> Pending:
    """`load` for such a table: its runs, or `why` it has none while its spec is missing."""
    return Pending(runs_data(ctx)) if ctx.table.spec_path.is_file() else Pending(None, why)


def runs_data(ctx: Context) -> RunsData:
    """`load` for a table built from its sweep's runs."""
    return RunsData(ctx.spec(), ctx.cells(), ctx.run_tag(), ctx.runs, ctx.out)


def runs_page(d: RunsData, body: str) -> str:
    """table.md of a sweep table: title, where it comes from, the body, the plot."""
    name = d.spec.name
    return "\n".join([f"# {d.spec.title}", "",
                      f"{generated_by(name, 'make table-' + name)} from the runs' logs, after "
                      "its sweep; do not edit.", "",
                      provenance(d.cells, d.tag, d.root, d.budget("target"), d.jobs), "",
                      body, *identity.lines(d.cells), f"![{name}]({name}.png)",
                      ""])


# ----------------------------------------------------------------------------------------
# Building


def build(table: Table, ctx: Context) -> Any:
    """experiments/<name>/table.md (and its PNG) from what the table loads; returns that."""
    data = table.load(ctx)
    ctx.out.mkdir(parents=True, exist_ok=True)
    written = [ctx.out / "table.md"]
    page, claims = table.render(data), verdict_section(table.verdicts(data))
    if said := column_terms(page):  # a column the page shows and does not define
        page = page.rstrip("\n") + f"\n\n{said}\n"
    written[0].write_text(page.rstrip("\n") + "\n" + claims if claims else page)
    if table.plot is not None:
        written.append(ctx.out / f"{table.name}.png")
        table.plot(data, written[-1])
    if table.also is not None:
        table.also(data, ctx.out)
    print("wrote " + " and ".join(map(str, written)))
    return data


def measured_path(out: Path, name: str, file: str) -> Path:
    """Where a table's file for the library goes: into the package (bnlab/measured/, what the
    doctor reads and the wheel ships) when the table is built into the repository's
    experiments/<name>/, else beside the table (a build elsewhere, as the tests make, leaves the
    package alone)."""
    return MEASURED / file if out.resolve() == (EXPERIMENTS / name).resolve() else out / file


def verdict_section(verdicts: list[Verdict]) -> str:
    """The page's claims, each with its verdict and what was measured for it: every number
    the README and experiments/README.md quote from a verdict is on the page they link."""
    if not verdicts:
        return ""
    return "\n".join(["", "## The claims this page rules on", "",
                      *[f"- {v.claim} ({v.claimed}): **{v.verdict}**. {v.ours}" for v in
                        verdicts], ""])


def bench_section(section: str, folder: Path = BENCH_RESULTS) -> dict[str, dict]:
    """`make bench`'s rows of one section (benchmarks/results/<machine>.json), by machine, each
    with the run that measured them (its date, commit and command); {} where none has."""
    out = {}
    for f in sorted(folder.glob("*.json")):
        res = json.loads(f.read_text())
        rows = [r for r in res.get("rows", []) if r.get("section") == section]
        if rows:
            run = {r["id"]: r for r in res.get("runs", [])}.get(rows[0].get("run"), {})
            out[res["machine"]["machine"]] = {"date": run.get("date"), "commit": run.get("commit"),
                                              "command": run.get("command"), "rows": rows}
    return out


def save_results(path: Path, res: dict) -> None:
    """A table's measurement as JSON (results.json, ddpcheck.json): the one writer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")


def measure(table: Table, ctx: Context, train_s: float) -> None:
    """Measure what the table measures beyond training and keep it in its `saved` file, with
    the seconds it took plus `train_s` (the sweep's, training included) as `measure_s`
    unless the measurement timed itself."""
    t0 = time.perf_counter()
    res = table.measure(ctx)
    res.setdefault("measure_s", round(train_s + time.perf_counter() - t0, 1))
    save_results(ctx.out / table.saved, res)
