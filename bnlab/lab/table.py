"""One reported table, and everything every table shares: its command line, what it measured
(results.json), the lines at its head, table.md, its PNG and its verdicts in
experiments/README.md.

    python -m bnlab.claims NAME... | all [--report] [--data DIR] [--jobs N] [--runs DIR]

Each module of bnlab/claims/ exports one `Table`; `make table-<name>` runs
`bnlab/claims/<name>.py` and writes `experiments/<name>/`. Without `--report` a table first
trains what its `experiments/<name>/sweep.yaml` asks for (every table named shares one pool
of jobs) and measures what it measures beyond training; with `--report` it is rebuilt from
the runs' logs and its results.json only. This module never imports bnlab.claims: the
registry is handed to `main`.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bnlab.cli import run_cli
from bnlab.errors import BnlabError
from bnlab.jitter import MIN_EVALS, WINDOW
from bnlab.lab.results import (
    BUDGET_MIN,
    JOBS,
    CellResult,
    Run,
    collect,
    run_minutes,
    wall_minutes,
)
from bnlab.lab.sweep import (
    Spec,
    add_launcher_args,
    data_tag,
    launcher_kwargs,
    load_spec,
    outcome,
    read_hosts,
    sweep,
)
from bnlab.paths import EXPERIMENTS, ROOT, RUNS, shown

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


def claim_order(v: Verdict) -> tuple[str, int]:
    """C1 .. C13, then L1, L2: the order of ../shared/CLAIMS.md."""
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
    def by_label(self) -> dict[str, CellResult]:
        return {c.cell.label: c for c in self.cells}


def runs_data(ctx: Context) -> RunsData:
    """`load` for a table built from its sweep's runs."""
    return RunsData(ctx.spec(), ctx.cells(), ctx.run_tag(), ctx.runs, ctx.out)


def runs_page(d: RunsData, body: str) -> str:
    """table.md of a sweep table: title, where it comes from, the body, the plot."""
    name = d.spec.name
    return "\n".join([f"# {d.spec.title}", "",
                      f"{generated_by(name, 'make table-' + name)} from the runs' logs, after "
                      "its sweep; do not edit.", "",
                      provenance(d.cells, d.tag, d.root, d.spec.extra.get("budget", True)), "",
                      body, f"![{name}]({name}.png)",
                      ""])


# ----------------------------------------------------------------------------------------
# Lines at a table's head


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def run_machines(run: Run, hosts: dict[str, list[str]]) -> list[str]:
    """The machines a run trained on, at its start and at each resume: named in its run.json,
    or, where an older entry names only its host, every machine hosts.json knows under that
    name, said to be a guess."""
    out = []
    for e in [run.info, *run.info.get("resumed", [])]:
        if e.get("machine"):
            out.append(e["machine"])
            continue
        host = e.get("host", "?")
        known = " or ".join(f'"{m}"' for m in hosts.get(host, [])) or "unknown"
        out.append(f"host {host}, machine not recorded per run: {known}")
    return list(dict.fromkeys(out))


def provenance(cells: list[CellResult], tag: str, root: Path = RUNS, budget: bool = True) -> str:
    """Data, machine, commits and compute of the runs behind a table, read from the runs;
    `budget`: the wall time is set against the short-protocol tables' budget (a sweep spec
    without one says `budget: false`)."""
    runs = [r for c in cells for r in c.runs]
    if not runs:
        return f"No finished runs yet under `{shown(root)}/{tag}/`."
    commits = sorted({r.info.get("commit") or "?" for r in runs})
    hosts = read_hosts(root / tag)
    machines = sorted({m for r in runs for m in run_machines(r, hosts)})
    devices = sorted({r.info.get("device", "?") for r in runs})
    torch_v = sorted({r.info.get("versions", {}).get("torch") or "?" for r in runs})
    expected = sum(c.expected for c in cells)
    held = sorted({r.holdout for r in runs})
    where = "its test split" if held == [0] else \
        f"{' or '.join(map(str, held))} training images held out of training"
    return "\n".join([
        f"- Data: `{tag}` (CIFAR-10 training images read from the sweep's `--data`; "
        f"validation on {where})",
        f"- Machine: {'; '.join(machines)}; device {', '.join(devices)}; torch "
        f"{', '.join(torch_v)}",
        f"- Commit(s): {', '.join(f'`{c}`' for c in commits)}",
        f"- Runs: {len(runs)} of {expected} finished; summed run time "
        f"{run_minutes(runs):.1f} min (each run's sweep.json, all its launches; other work "
        "sometimes shared the cores)",
        f"- Wall time of this target: {budget_line(runs, expected, 'target')}" if budget else
        f"- Wall time of this target: about {wall_minutes(runs):.0f} min at {JOBS} runs side by "
        f"side for the {len(runs)} of {expected} runs finished (no budget: the headline "
        "protocol takes hours on this machine)",
    ])


def budget_line(runs: list, expected: int, limit: str) -> str:
    """The runs' wall time against the budget `limit` ("target" or "all"), in one sentence."""
    minutes, cap = wall_minutes(runs), BUDGET_MIN[limit]
    done = len({r.path for r in runs})
    scope = "" if done == expected else f" (the {done} of {expected} runs finished so far)"
    verdict = "within it" if minutes <= cap else f"missed, {minutes / cap:.1f}x over"
    return (f"budget {cap} min on this machine; the runs{scope} come to about {minutes:.0f} "
            f"min at {JOBS} runs side by side: {verdict}")


def wall_line(res: dict) -> str:
    """A results.json's wall times as one sentence for its table."""
    parts = []
    if res.get("train_s") is not None:
        parts.append(f"training its runs took {res['train_s'] / 60:.1f} min of wall time "
                     "(their sweep.json, summed; runs share the cores with other jobs)")
    if res.get("measure_s") is not None:
        parts.append(f"the measuring command took {res['measure_s'] / 60:.1f} min")
    return ("Wall time on this machine: " + "; ".join(parts) + ".") if parts else ""


def seeds_line(cells) -> str:
    """Which seeds the table's cells ran, and why not more."""
    seeds = sorted({c["seed"] for c in cells})
    if len(seeds) > 1:
        return f"Seeds {', '.join(map(str, seeds))}."
    return (f"Seed {seeds[0]} of each cell: one seed, because a target gets 30 minutes on this "
            "2-core machine and one 4x2 run takes about 8 minutes at 2 jobs; differences "
            "smaller than a run's swing are not evidence here.")


SWING_NOTE = (f"Swing: half the peak-to-peak range of val acc over the evaluations in the last "
              f"{WINDOW:.0%} of training (at least {MIN_EVALS}), the claims' \"+/- points\"; step "
              "sd: standard deviation of successive differences there. Mean ± std over seeds; "
              "`-` where no seed finished or every seed diverged.")

METRIC_HEADER = ["seeds", "final val acc (%)", "best val acc (%)", "swing (± pts)",
                 "step sd (pts)", "final train loss"]


def metric_cells(c: CellResult) -> list[str]:
    """A cell's row under METRIC_HEADER."""
    return [c.seeds_note(), c.stat("final").fmt(), c.stat("best").fmt(),
            c.stat("swing").fmt(), c.stat("step_sd").fmt(), c.stat("loss").fmt(2)]


# ----------------------------------------------------------------------------------------
# Verdicts in experiments/README.md


def replace_block(path: Path, begin: str, end: str, block: str) -> None:
    """Put `block` (which starts with `begin` and ends with `end`) in place of the text
    between those markers in `path`, or append it."""
    text = path.read_text() if path.is_file() else "# experiments\n"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    path.write_text(head + block + rest.split(end, 1)[1])


def claim_rows(vs: list[Verdict], mark: str = "") -> list[str]:
    """The claims' markdown table; `mark` follows each verdict that was decided."""
    rows = ["| claim | command | claimed | ours | verdict | why |", "|---|---|---|---|---|---|"]
    for v in vs:
        verdict = v.verdict + (mark if v.verdict != "not run yet" else "")
        rows.append(f"| {v.claim} | `{v.command}` | {v.claimed} | {v.ours} | **{verdict}** "
                    f"| {v.why} |")
    return rows


def write_verdicts(readme: Path, marker: str, built: list[tuple[Table, Any]]) -> None:
    """The verdicts of the tables in `built` between `<!-- marker:begin/end -->` of `readme`,
    in the claims' order. Where the tables are sweeps, the block also says how many of their
    runs have finished (verdicts are preliminary until all have) and their wall time together
    against the budget."""
    if not any(t.claims for t, _ in built):
        return  # history: tables kept for their numbers, whose claims are ruled elsewhere
    verdicts = sorted((v for t, d in built for v in t.verdicts(d)), key=claim_order)
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
    ruling = [t for t, d in built if isinstance(d, RunsData) and t.claims] or \
        [t for t, d in built if isinstance(d, RunsData)]
    again = "`make tables`" if marker == "claims" else ", ".join(f"`{t.make}`" for t in ruling)
    tables = "the table calls" if len(sweeps) == 1 else f"the {n} tables call"
    status = "" if done == expected else (
        f"**Preliminary:** {done} of the {expected} runs {tables} for have "
        f"finished ({short} of {len(unique)} cells lack seeds); the sweep goes on with "
        f"{again}, and these verdicts may change. ")
    runs = [r for c in cells for r in c.runs]
    if marker == "claims":  # the three short-protocol sweeps had a budget; `make tables`
        budget = (f"Wall time of all {n} tables together (`make tables`, shared cells run "
                  f"once): {budget_line(runs, expected, 'all')}; each table gives its own.")
    else:
        these = "this table" if len(sweeps) == 1 else f"these {n} tables together"
        budget = (f"Wall time of the runs of {these} (shared cells run once): "
                  f"about {wall_minutes(runs):.0f} min at {JOBS} runs side by side on this "
                  f"machine, for the {done} of {expected} runs finished.")
    replace_block(readme, begin, end, "\n".join([
        begin, f"{status}Generated by `make report` from the runs in "
        f"`{shown(sweeps[0].root)}/{sweeps[0].tag}/`; each rule is written beside its table in "
        "`bnlab/claims/<table>.py`.", "",
        *claim_rows(verdicts, "" if done == expected else " (preliminary)"), "", budget, end]))
    print(f"wrote the claims' verdicts into {readme}")
    figures = [f"experiments/{t.name}/{t.headline}" for t, _ in built if t.headline]
    if figures and readme.resolve() == (EXPERIMENTS / "README.md").resolve() and \
            all(d.root.resolve() == RUNS.resolve() for d in sweeps):  # the committed runs
        write_headline(ROOT / "README.md", figures, verdicts, status)


def write_headline(path: Path, figures: list[str], verdicts: list[Verdict], status: str) -> None:
    """The headline tables' figures and verdicts (claim, ours, verdict) in `path` (the
    project's README.md) between `<!-- headline:begin/end -->`."""
    begin, end = "<!-- headline:begin -->", "<!-- headline:end -->"
    text = path.read_text() if path.is_file() else ""
    if begin not in text or end not in text:
        raise BnlabError(f"{path} lacks the lines {begin} and {end} that the headline goes "
                         "between; put them back where the headline belongs.")
    rows = ["| claim | claimed | ours | verdict |", "|---|---|---|---|"]
    rows += [f"| {v.claim} | {v.claimed} | {v.ours} | **{v.verdict}"
             f"{' (preliminary)' if status and v.verdict != 'not run yet' else ''}** |"
             for v in verdicts]
    replace_block(path, begin, end, "\n".join([
        begin, *(f"![{Path(f).stem}]({f})" for f in figures), "",
        f"{status}Generated by `make report`; the rules, the reasons and every other claim: "
        "[experiments/README.md](experiments/README.md).", "", *rows, end]))


# ----------------------------------------------------------------------------------------
# Building and the command line


def build(table: Table, ctx: Context) -> Any:
    """experiments/<name>/table.md (and its PNG) from what the table loads; returns that."""
    data = table.load(ctx)
    ctx.out.mkdir(parents=True, exist_ok=True)
    written = [ctx.out / "table.md"]
    written[0].write_text(table.render(data))
    if table.plot is not None:
        written.append(ctx.out / f"{table.name}.png")
        table.plot(data, written[-1])
    print("wrote " + " and ".join(map(str, written)))
    return data


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


def main(registry: dict[str, Table], argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bnlab.claims",
                                description="Train, measure and write the reported tables.")
    p.add_argument("names", nargs="+", choices=[*registry, "all"], metavar="NAME",
                   help=f"{', '.join(registry)}, or all")
    p.add_argument("--report", action="store_true",
                   help="no training or measuring: rebuild from the runs and results.json")
    p.add_argument("--data", help="folder holding cifar-10-batches-py (no download)")
    p.add_argument("--jobs", type=int, default=1, help="training runs side by side")
    p.add_argument("--runs", type=Path, default=RUNS, help="folder of run directories")
    p.add_argument("--tag", help="data tag: a folder of --runs (default: the only one)")
    p.add_argument("--experiments", type=Path, default=EXPERIMENTS,
                   help="where experiments/<name>/ and README.md are written")
    add_launcher_args(p)
    a = p.parse_args(argv)
    tables = list(registry.values()) if "all" in a.names else \
        [registry[n] for n in dict.fromkeys(a.names)]

    def body() -> int:
        if a.jobs < 1:
            raise BnlabError(f"--jobs={a.jobs} must be at least 1.")
        kw = launcher_kwargs(a)
        t0, train_s = time.perf_counter(), 0.0
        here = kw["launcher"] == "local"
        ctxs = [Context(t, a.experiments, a.runs, a.tag, a.data, here) for t in tables]
        trained = [c for c in ctxs if c.table.trains]
        if not a.report and trained:  # every table's sweep in one pool: shared cells run once
            specs = [c.spec() for c in trained]
            counts = sweep(specs, a.data, a.jobs, root=a.runs, **kw)
            rc = outcome(counts, (time.perf_counter() - t0) / 60)
            if counts.get("submitted") or counts.get("on SLURM"):  # the tables wait for them
                return rc
            if rc:
                return rc
            train_s = time.perf_counter() - t0
            tag = a.tag or data_tag(specs[0].cells[0].cfg)
            for c in ctxs:
                c.tag = tag
        built = []
        for c in ctxs:
            if not a.report and c.table.measure is not None:
                measure(c.table, c, train_s)
            built.append((c.table, build(c.table, c)))
            # A README block is written once every table that shares it is built.
            group = [(t, d) for t, d in built if t.marker == c.table.marker]
            if len(group) == sum(t.marker == c.table.marker for t in registry.values()):
                write_verdicts(c.readme, c.table.marker, group)
        return 0

    return run_cli(body)
