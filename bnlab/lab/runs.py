"""Your own runs at a glance: a table across any runs (a Hydra multirun's jobs, a folder of
runs) and their curves side by side.

    python -m bnlab runs outputs/train/multirun_<stamp>          # the table, in markdown
    python -m bnlab plot outputs/train/multirun_<stamp> --out runs.png

A Hydra multirun prints the table itself when its last job ends (configs/train.yaml's
callback). The table's columns: the overrides in which the runs differ, how each ended, its
final val acc, and on the plateau (the second half of training, bnlab/jitter.py) its mean val
acc, its jitter (von Neumann sd) and the churn floor beside it (with record.predictions=true).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hydra.experimental.callback import Callback

from bnlab.errors import BnlabError
from bnlab.lab.page import md_table
from bnlab.lab.results import Run, fmt


def find(paths: list[Path]) -> list[Run]:
    """Every run directory (one holding metrics.jsonl) at or under `paths`, in path order."""
    dirs = []
    for p in map(Path, paths):
        if not p.exists():
            raise BnlabError(f"{p} does not exist; give run directories or the folders above "
                             "them (a multirun's outputs/<name>/multirun_<stamp>).")
        dirs += [p] if (p / "metrics.jsonl").is_file() else \
            sorted(f.parent for f in p.rglob("metrics.jsonl"))
    if not dirs:
        raise BnlabError(f"no run directory (one holding metrics.jsonl) under "
                         f"{', '.join(map(str, paths))}.")
    return [Run.read(d) for d in dict.fromkeys(dirs)]


def differing(runs: list[Run]) -> list[dict[str, str]]:
    """Each run's overrides (run.json) in which the runs differ; keys every run shares at one
    value are left out."""
    parsed = [dict(o.split("=", 1) for o in r.info.get("overrides", []) if "=" in o
                   and not o.startswith(("hydra.", "data.root", "output_dir")))
              for r in runs]
    keys = sorted({k for p in parsed for k in p})
    vary = [k for k in keys if len({p.get(k) for p in parsed}) > 1]
    return [{k: p.get(k, "-") for k in vary} for p in parsed]


def epochs_of(run: Run) -> float:
    """The run's planned epochs (config.yaml), else the last epoch it logged."""
    if (run.path / "config.yaml").is_file():
        return run.cfg["epochs"]
    return max(run.epochs, default=0.0)


def table(runs: list[Run], root: Path | None = None) -> str:
    diffs = differing(runs)
    keys = list(diffs[0]) if diffs else []
    rows = []
    for r, d in zip(runs, diffs, strict=True):
        j = r.jitter(epochs_of(r))
        name = str(r.path.relative_to(root)) if root and r.path.is_relative_to(root) else \
            str(r.path)
        rows.append([name, *(d[k] for k in keys), r.status or "-",
                     fmt(r.accs[-1] if r.accs else None), fmt(j.get("plateau_acc")),
                     fmt(j.get("vn_sd"), 2), fmt(j.get("churn_floor"), 2)])
    return md_table(["run", *keys, "status", "final val acc (%)", "plateau val acc (%)",
                     "jitter (von Neumann sd, pts)", "churn floor (pts)"], rows)


def plot(runs: list[Run], out: Path) -> None:
    """Val acc and val loss of every run side by side, each labelled with its jitter."""
    from bnlab.lab.figures import legend, nothing_yet, plt, save  # matplotlib: only to draw

    fig, (acc, loss) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = [" ".join(f"{k}={v}" for k, v in d.items()) or r.path.name
              for r, d in zip(runs, differing(runs), strict=True)]
    for r, label in zip(runs, labels, strict=True):
        vn = r.jitter(epochs_of(r)).get("vn_sd")
        tag = label + (f" (jitter {vn:.2f})" if vn is not None else "")
        acc.plot(r.epochs, r.accs, marker=".", ms=3, lw=1, label=tag)
        loss.plot(*r.series("val/loss"), lw=1, label=label)
    if not any(r.accs for r in runs):
        nothing_yet(acc, "no evaluation logged yet")
    acc.set(title="val accuracy", xlabel="epoch", ylabel="val accuracy (%)")
    loss.set(title="val loss", xlabel="epoch", ylabel="val loss", yscale="log")
    for ax in (acc, loss):
        ax.grid(alpha=0.3)
        legend(ax, 7)
    save(fig, out, f"{len(runs)} run(s)")


def run_table(a: argparse.Namespace) -> int:
    """`bnlab runs PATH...` (its parser: bnlab/commands.py)."""
    print(table(find(a.paths), common_root(a.paths)))
    return 0


def run_plot(a: argparse.Namespace) -> int:
    plot(find(a.paths), a.out)
    print(f"wrote {a.out}")
    return 0


def common_root(paths: list[Path]) -> Path | None:
    return Path(paths[0]) if len(paths) == 1 else None


class MultirunTable(Callback):
    """A Hydra callback (configs/train.yaml): when a multirun's last job ends, its table."""

    def on_multirun_end(self, config, **kwargs) -> None:
        root = Path(config.hydra.sweep.dir)
        try:
            print(f"\n{root}:\n{table(find([root]), root)}")
        except BnlabError as e:  # no job left a run (each was refused): nothing to tabulate
            print(f"bnlab: {e}")
