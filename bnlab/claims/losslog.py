"""`make figure-losslog` (claim C13): one run's train-loss curve two ways, from its own log.

    python -m bnlab.claims losslog [--tag cifar10-5085]

Every train line of metrics.jsonl holds both: `train/loss`, the mean over every step and
every rank since the previous line (what bnlab plots), and `train/loss_rank0`, the loss of
the single step at the log step (the sparse sample a logger shows when it reduces, or
reads, only at log steps; in the 4-rank simulation that step's loss is over all 4 ranks'
images, which is what an all-reduce at the log step gives). No training: it reads the
table-jitter runs (CELLS, seed SEED). Writes experiments/losslog/{table.md, losslog.png} and
C13's verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bnlab.errors import BnlabError
from bnlab.jitter import MIN_EVALS, step_sd
from bnlab.lab.figures import plt, save
from bnlab.lab.page import kernels_line
from bnlab.lab.plan import run_dir
from bnlab.lab.results import Run
from bnlab.lab.spec import load_spec
from bnlab.lab.table import Context, Table, Verdict
from bnlab.paths import EXPERIMENTS, RUNS, shown

SPARSE, MEAN = "train/loss_rank0", "train/loss"
CELLS, SEED = ("bn", "syncbn"), 0  # the table-jitter runs shown


def curves(d: Path) -> tuple[list[int], list[float], list[float]]:
    rows = [r for r in Run.read(d).rows if r.get(SPARSE) is not None and r.get(MEAN) is not None]
    if len(rows) < MIN_EVALS:
        raise BnlabError(f"{d} has fewer than {MIN_EVALS} train lines with both losses.")
    return [r["step"] for r in rows], [r[SPARSE] for r in rows], [r[MEAN] for r in rows]


def find_runs(cells: list[str], seed: int, tag: str, root: Path = RUNS) -> dict[str, Path]:
    spec = load_spec(EXPERIMENTS / "jitter" / "sweep.yaml")
    by_label = {c.label: c for c in spec.cells}
    out = {}
    for label in cells:
        if label not in by_label:
            raise BnlabError(f"no cell {label!r} in experiments/jitter/sweep.yaml; choose from "
                             f"{', '.join(by_label)}.")
        d = run_dir(tag, by_label[label], seed, root)
        if not (d / "metrics.jsonl").is_file():
            raise BnlabError(f"the {label} run (seed {seed}) is not in {d.parent}; run "
                             "`make table-jitter` first.")
        out[label] = d
    return out


@dataclass
class Curves:
    """The runs shown, and each one's curves: steps, the sparse sample, the running mean."""

    seed: int
    runs: dict[str, Path]
    data: dict[str, tuple[list[int], list[float], list[float]]]

    @property
    def rough(self) -> dict[str, tuple[float, float]]:
        """Each run's step-to-step sd of the sparse and of the mean curve."""
        return {k: (step_sd(s), step_sd(m)) for k, (_, s, m) in self.data.items()}


def load(ctx: Context, cells=CELLS, seed: int = SEED) -> Curves:
    runs = find_runs(list(cells), seed, ctx.run_tag(), ctx.runs)
    return Curves(seed, runs, {label: curves(d) for label, d in runs.items()})


def plot(c: Curves, path: Path) -> None:
    data = c.data
    fig, axes = plt.subplots(1, len(data), figsize=(6 * len(data), 4), squeeze=False)
    for ax, (label, (steps, sparse, mean)) in zip(axes[0], data.items(), strict=True):
        ax.plot(steps, sparse, lw=0.8, alpha=0.8, label="the log step's loss (sparse sample)")
        ax.plot(steps, mean, lw=1.6, label="mean over every step and rank since the last line")
        ax.set_title(f"{label}: train loss as logged", fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("train loss")
        ax.legend(fontsize=8)
    save(fig, path)


def verdict(rough: dict[str, tuple[float, float]]) -> Verdict:
    ratios = {k: s / m for k, (s, m) in rough.items()}
    ours = "; ".join(f"{k}: step-to-step sd {s:.3f} sparse vs {m:.3f} mean ({ratios[k]:.1f}x)"
                     for k, (s, m) in rough.items())
    low = min(ratios.values())
    v = "reproduced" if low >= 2 else "partly" if low >= 1.25 else "not reproduced"
    return Verdict("C13", "make figure-losslog", "sparse logging looks far noisier; training "
                   "unaffected", ours, v,
                   "Both curves come from the same run, so training is the same by "
                   "construction. Rule: reproduced if the sparse curve's step-to-step sd is "
                   "2x or more the mean's in every run shown; partly if 1.25x or more.")


def render(c: Curves) -> str:
    runs, data, rough, seed = c.runs, c.data, c.rough, c.seed
    v = verdict(rough)
    lines = ["# How the loss is logged (C13)", "",
             TABLE.generated + " from the runs' "
             "metrics.jsonl; no training.", "",
             kernels_line([Run.read(d, seed) for d in runs.values()]), "",
             "| run | train lines | sparse: step-to-step sd | mean: step-to-step sd | ratio | "
             "sparse: range | mean: range |", "|---|---|---|---|---|---|---|"]
    for label, d in runs.items():
        steps, s, m = data[label]
        lines.append(f"| {label}, seed {seed} (`{shown(d)}`) | {len(steps)} | "
                     f"{rough[label][0]:.3f} | {rough[label][1]:.3f} | "
                     f"{rough[label][0] / rough[label][1]:.1f}x | "
                     f"{min(s):.2f}-{max(s):.2f} | {min(m):.2f}-{max(m):.2f} |")
    lines += ["", "Sparse: `train/loss_rank0`, the loss of the one step at each log step. Mean: "
              "`train/loss`, the mean over every step and every rank since the previous line "
              "(reduced across ranks at log time only). Step-to-step sd: the standard "
              "deviation of successive differences along the curve.", "",
              "![losslog](losslog.png)", "", f"**C13 verdict: {v.verdict}.** {v.why}", ""]
    return "\n".join(lines)


def verdicts(c: Curves) -> list[Verdict]:
    return [verdict(c.rough)]


TABLE = Table("losslog", ("C13",), load, render, verdicts, plot, target="figure-losslog")
