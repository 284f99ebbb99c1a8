"""What `make table-<name>` runs: train a table's sweep, measure, build its page, write the
verdicts.

    python -m bnlab.claims NAME... | all [--report] [--data DIR] [--jobs N] [--runs DIR]

Without `--report` a table first trains what its `experiments/<name>/sweep.yaml` asks for
(every table named shares one pool of jobs) and measures what it measures beyond training;
with `--report` it is rebuilt from the runs' logs and its results.json only. Where the advice
goes to bnlab/measured/ (the default `--experiments`), the doctor's outputs quoted in
docs/library.md are rewritten last (bnlab/lab/quoted.py). This module never imports
bnlab.claims: the registry is handed to `main`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bnlab.cli import run_cli
from bnlab.errors import BnlabError
from bnlab.lab import figures, quoted
from bnlab.lab.readme import write_verdicts
from bnlab.lab.spec import data_tag
from bnlab.lab.sweep import add_launcher_args, launcher_kwargs, outcome, sweep
from bnlab.lab.table import Context, Table, build, measure
from bnlab.paths import EXPERIMENTS, RUNS


def default_jobs(specs: list, launcher: str) -> int:
    """Runs side by side when --jobs is not given: here, the largest `jobs:` of the specs (what
    was measured best on the machine they were written for), else 1; on SLURM every run of
    the specs at once (the cluster's queue decides)."""
    if launcher == "local":
        return max(s.extra.get("jobs", 1) for s in specs)
    return max(1, sum(len(c.seeds) for s in specs for c in s.cells))


def main(registry: dict[str, Table], argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bnlab.claims",
                                description="Train, measure and write the reported tables.")
    p.add_argument("names", nargs="+", choices=[*registry, "all"], metavar="NAME",
                   help=f"{', '.join(registry)}, or all")
    p.add_argument("--report", action="store_true",
                   help="no training or measuring: rebuild from the runs and results.json")
    p.add_argument("--data", help="folder holding cifar-10-batches-py (no download)")
    p.add_argument("--jobs", type=int, default=None,
                   help="training runs side by side (default: here, the largest `jobs:` of the "
                   "tables' sweep.yaml, else 1; on SLURM, every run at once)")
    p.add_argument("--runs", type=Path, default=RUNS, help="folder of run directories")
    p.add_argument("--tag", help="data tag: a folder of --runs (default: the only one)")
    p.add_argument("--experiments", type=Path, default=EXPERIMENTS,
                   help="where experiments/<name>/ and README.md are written")
    add_launcher_args(p)
    a = p.parse_args(argv)
    tables = list(registry.values()) if "all" in a.names else \
        [registry[n] for n in dict.fromkeys(a.names)]

    def body() -> int:
        if a.jobs is not None and a.jobs < 1:
            raise BnlabError(f"--jobs={a.jobs} must be at least 1.")
        kw = launcher_kwargs(a)
        t0, train_s = time.perf_counter(), 0.0
        figures.PROBLEMS.clear()  # this build's figures alone
        here = kw["launcher"] == "local"
        ctxs = [Context(t, a.experiments, a.runs, a.tag, a.data, here) for t in tables]
        trained = [c for c in ctxs if c.table.trains]
        if not a.report and trained:  # every table's sweep in one pool: shared cells run once
            specs = [c.spec() for c in trained]
            jobs = a.jobs or default_jobs(specs, kw["launcher"])
            counts = sweep(specs, a.data, jobs, root=a.runs, **kw)
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
        # A README block is written where every table that shares it is built, once all are:
        # the headline's findings come from every table built, whatever its block.
        for c in ctxs:
            group = [(t, d) for t, d in built if t.marker == c.table.marker]
            if c.table is group[-1][0] and \
                    len(group) == sum(t.marker == c.table.marker for t in registry.values()):
                write_verdicts(c.readme, c.table.marker, group, built)
        if a.experiments.resolve() == EXPERIMENTS.resolve():  # the advice went to bnlab/measured/
            quoted.refresh()  # the doctor's outputs in docs/library.md cite what it now says
        if figures.PROBLEMS:  # written, but a figure a reader cannot read is a failed build
            print(f"bnlab: {len(figures.PROBLEMS)} figure text problem(s), listed above; "
                  "fix the plot that draws each.", file=sys.stderr)
            return 1
        return 0

    return run_cli(body)
