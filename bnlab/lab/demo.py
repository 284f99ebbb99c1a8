"""`make demo`: the finding in about two minutes. bn, syncbn and gn train side by side at 4
simulated ranks x 2 images (configs/experiment/demo.yaml), then one plot and one table show
their validation curves and jitter, built only from the runs' own logs.

    python -m bnlab.lab.demo --out outputs/demo/<stamp>             # generated data, offline
    python -m bnlab.lab.demo --out outputs/demo/<stamp> --data DIR  # CIFAR-10 from DIR
    python -m bnlab.lab.demo --out outputs/demo/<stamp> --report    # no training: table again

The default data is the synthetic set made easy (per-pixel noise 0.2 instead of 1.2): each
class is a smooth colour pattern, so a model that trains well reaches ~100% within the demo's
500 steps, and what stays in its curve is the jitter. The model is the claims' torchvision
resnet18: at 32x32 inputs its last stage holds 1x1 maps, so at 2 images per rank BN
normalizes over 2 values per channel (the run's warning names those layers).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from bnlab.cli import run_cli
from bnlab.errors import BnlabError
from bnlab.lab.figures import plt, save
from bnlab.lab.results import Run
from bnlab.lab.sweep import data_tag, outcome, run_dir, spec_from, sweep
from bnlab.paths import CONFIGS

NORMS = ("bn", "syncbn", "gn")
SYNTHETIC = ["data.noise=0.2"]   # the generated set made easy enough to converge in the demo
SPEC = {"experiment": "demo", "seeds": [0],
        "cells": [{"label": n, "overrides": [f"norm={n}"]} for n in NORMS]}
COLUMNS = ("norm", "status", "final val acc", "plateau val acc", "swing (+/- pts)",
           "von Neumann sd (pts)", "churn floor (pts)", "log val-loss jitter", "min BN values",
           "train s")


def spec(data: str | None, out: Path):
    """The demo's three cells; with `data`, on CIFAR-10 read from it."""
    extra = ["data=cifar10"] if data else SYNTHETIC
    raw = {**SPEC, "cells": [{**c, "overrides": [*c["overrides"], *extra]}
                             for c in SPEC["cells"]]}
    return spec_from(raw, CONFIGS / "experiment" / "demo.yaml", data, name="demo")


def runs_of(s, out: Path) -> list[Run]:
    """The demo's runs in `out` (one sentence when one is missing)."""
    tag = data_tag(s.cells[0].cfg)
    return [Run.read(run_dir(tag, c, 0, out / "runs"), seed=0) for c in s.cells]


def row(run: Run) -> dict:
    total = run.cfg["epochs"]
    j = run.jitter(total)
    counts = run.info.get("bn_values_per_channel") or {}
    return {"norm": run.cfg["norm"]["kind"], "status": run.status or "?",
            "final val acc": run.accs[-1] if run.accs else None,
            "plateau val acc": j.get("plateau_acc"), "swing (+/- pts)": j.get("swing"),
            "von Neumann sd (pts)": j.get("vn_sd"), "churn floor (pts)": j.get("churn_floor"),
            "log val-loss jitter": j.get("loss_jitter"),
            "min BN values": min(counts.values()) if counts else None,
            "train s": run.last("time/train_s")}


def markdown_table(rows: list[dict]) -> str:
    def cell(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def plot(runs: list[Run], rows: list[dict], out: Path, title: str) -> None:
    """Val acc and val loss at every evaluation, one line per norm; the legend carries each
    run's jitter on the plateau (shaded) beside the test set's churn floor."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5.2))
    total = runs[0].cfg["epochs"]
    for run, r in zip(runs, rows, strict=True):
        def num(k, r=r):
            return "-" if r[k] is None else f"{r[k]:.1f}"
        label = (f"{r['norm']}: {num('plateau val acc')}% on the plateau, jitter "
                 f"{num('von Neumann sd (pts)')} pts (floor {num('churn floor (pts)')}), swing "
                 f"+/-{num('swing (+/- pts)')}")
        ax1.plot(*run.series("val/acc"), marker=".", label=label)
        ax2.plot(*run.series("val/loss"), marker=".", label=r["norm"])
    for ax in (ax1, ax2):
        ax.axvspan(total / 2, total, color="0.9", zorder=0)
        ax.set_xlabel("epoch (shaded: the plateau, where jitter is measured)")
        ax.grid(alpha=0.3)
    ax1.set(ylabel="val accuracy (%)", ylim=(0, 100))
    ax2.set(ylabel="val loss (log scale)", yscale="log")
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.16))
    ax2.legend(fontsize=8, loc="upper right")
    save(fig, out, title, dpi=110)


def write(runs: list[Run], out: Path, title: str) -> None:
    """`out`/table.md and `out`/demo.png from the demo's runs."""
    rows = [row(r) for r in runs]   # reads every run first: bad input leaves nothing behind
    table = markdown_table(rows)
    src = "\n".join(f"- `{r.path}` (commit {r.info.get('commit')})" for r in runs)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(
        f"# {title}\n\n{table}\n\nJitter: the von Neumann sd of val acc on the plateau (the "
        "evaluations after the first half of training), the noise of one evaluation; churn "
        "floor: what prediction flips alone would give on this test set (bnlab/jitter.py). "
        "Swing: half the range on the plateau, the claims' '+/- points'.\n\n"
        f"Generated by `python -m bnlab.lab.demo` from:\n{src}\n")
    plot(runs, rows, out / "demo.png", title)
    print(table)
    print(f"\nwrote {out / 'table.md'} and {out / 'demo.png'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the runs, table and plot")
    p.add_argument("--data", help="folder holding cifar-10-batches-py (default: generated data)")
    p.add_argument("--jobs", type=int, default=len(NORMS),
                   help="runs side by side (default: all three, one thread each)")
    p.add_argument("--report", action="store_true", help="no training: the table and plot again")
    a = p.parse_args(argv)

    def body() -> int:
        if a.jobs < 1:
            raise BnlabError(f"--jobs={a.jobs} must be at least 1.")
        s = spec(a.data, a.out)
        if not a.report:
            t0 = time.perf_counter()
            status = outcome(sweep([s], a.data, a.jobs, root=a.out / "runs"),
                             (time.perf_counter() - t0) / 60)
            if status:
                return status
        what = f"CIFAR-10 from {a.data}" if a.data else "generated data"
        write(runs_of(s, a.out), a.out, f"bnlab demo: resnet18, 4 simulated ranks x 2 images "
                                        f"({what})")
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
