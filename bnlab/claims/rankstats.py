"""`make table-rankstats` (claim C7): how far the ranks' running statistics drift apart.

    python -m bnlab.claims rankstats --data DIR [--runs experiments/runs]  # train, measure, table
    python -m bnlab.claims rankstats --report                               # from results.json

Trains the missing runs of experiments/rankstats/sweep.yaml (bn at 4x2 with DDP's buffer sync
on, torch's default, is table-jitter's own run; the other turns it off). Each final checkpoint
keeps the model's state (rank 0's running statistics, as a DDP checkpoint does) and every
rank's running statistics (`rank_bn_stats`). From them: the per-layer divergence across ranks
(`diagnostics.divergence`), which rank's statistics the model state holds, and, through
`evaluate.py`, val acc with each rank's statistics, their average and PreciseBN's.
Everything measured goes to experiments/rankstats/results.json; table.md and rankstats.png
are built from it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from bnlab.errors import BnlabError
from bnlab.lab.figures import plt, save
from bnlab.lab.page import results_kernels, seeds_line, wall_line
from bnlab.lab.plan import plan
from bnlab.lab.results import eval_json, train_seconds
from bnlab.lab.spec import data_tag
from bnlab.lab.table import Context, Table, Verdict

WIDE = 0.5  # running means "differ widely": the median layer's ranks differ by 0.5 std or more


def checkpoint_stats(d: Path) -> dict:
    """Per-layer divergence across the ranks, and which rank the model state matches."""
    from bnlab import checkpoint
    from bnlab.diagnostics import divergence

    checkpoint.require(d, "table-rankstats")
    state = checkpoint.load(d)
    ranks = state.get("rank_bn_stats") or []
    if len(ranks) < 2:
        raise BnlabError(f"the checkpoint in {d} keeps no per-rank statistics; it is not a "
                         "run of several ranks.")
    div = divergence(ranks)
    layers = list(ranks[0])
    model = state["model"]
    keeps = {f"rank {r}": max(float(((model[f"{n}.running_mean"] - s[n][0]).abs()
                                     / (s[n][1] + 1e-5).sqrt()).max()) for n in layers)
             for r, s in enumerate(ranks)}
    return {"layers": layers,
            "div_mean": [div[f"bn/div_mean/{n}"] for n in layers],
            "div_logvar": [div[f"bn/div_logvar/{n}"] for n in layers],
            "state_vs_rank": keeps}


def state_difference(a: Path, b: Path) -> float:
    """Largest absolute difference between two checkpoints' model states (0 = identical)."""
    from bnlab import checkpoint

    sa, sb = checkpoint.load(a)["model"], checkpoint.load(b)["model"]
    return max(float((sa[k].double() - sb[k].double()).abs().max()) if sa[k].numel() else 0.0
               for k in sa)


def measure(ctx: Context) -> dict:
    spec, runs = ctx.spec(), ctx.runs
    tag = data_tag(spec.cells[0].cfg)
    out, dirs = {}, []
    for cell, seed, d in plan(spec, tag, runs):
        out[cell.label] = {"seed": seed, "run": str(d.relative_to(runs)),
                           "buffers": cell.meta["buffers"], **checkpoint_stats(d),
                           "val_acc": eval_json(d, "table-rankstats")["val_acc"]}
        dirs.append(d)
    return {"date": time.strftime("%Y-%m-%d"), "tag": tag, "runs": out,
            "state_difference": state_difference(*dirs), "train_s": train_seconds(dirs)}


def _rank_accs(r: dict) -> dict[str, float]:
    return {k: v for k, v in r["val_acc"].items() if k.endswith("running statistics")}


def table(res: dict) -> str:
    runs = res["runs"]
    med = {k: statistics.median(r["div_mean"]) for k, r in runs.items()}
    lines = ["# Ranks disagree: running statistics across ranks (C7)", "",
             TABLE.generated + " from "
             f"`results.json`: each run's final checkpoint (data `{res['tag']}`, "
             f"{res['date']}). bn, 4 simulated ranks x 2 images. "
             + seeds_line(runs.values()), "",
             wall_line(res), "", results_kernels(res), "",
             "## Divergence across ranks", "",
             "Per layer: the largest difference between a rank's running mean and rank 0's, "
             "over ranks and channels, in units of rank 0's running std (`div_mean`), and the "
             "largest |log var_r - log var_0| (`div_logvar`); the summary takes the median and "
             "the largest layer.", "",
             "| run | div_mean median layer | div_mean largest | div_logvar median layer | "
             "div_logvar largest |", "|---|---|---|---|---|"]
    for k, r in runs.items():
        lines.append(f"| {k} (seed {r['seed']}) | {med[k]:.3f} | {max(r['div_mean']):.3f} | "
                     f"{statistics.median(r['div_logvar']):.3f} | {max(r['div_logvar']):.3f} |")
    lines += ["", "## What the checkpoint keeps", "",
              "The model's state dict, what a DDP checkpoint saves, against each rank's "
              "running means (largest difference over layers and channels, in that rank's "
              "running std; 0 = identical). bnlab also keeps every rank's statistics "
              "(`rank_bn_stats`).", "",
              "| run | " + " | ".join(next(iter(runs.values()))["state_vs_rank"]) + " |",
              "|---" * (1 + len(next(iter(runs.values()))["state_vs_rank"])) + "|"]
    for k, r in runs.items():
        lines.append(f"| {k} | " + " | ".join(f"{v:.3g}" for v in r["state_vs_rank"].values())
                     + " |")
    diff = res["state_difference"]
    lines += ["", "**The two runs' model states (every weight and rank 0's statistics) are "
              "identical**: in train mode BN normalizes with batch statistics, so the buffers "
              "never touch training, and the buffer sync sends rank 0's statistics to the "
              "others without changing rank 0's. The sync only changes what the other ranks "
              "hold." if diff == 0 else
              f"The two runs' model states differ by up to {diff:.3g} (largest absolute "
              "difference over every weight and statistic)."]
    cols = list(next(iter(runs.values()))["val_acc"])
    cols = [c for c in cols if "running statistics" in c or "average" in c
            or c.startswith("PreciseBN")]
    lines += ["", "## Val acc by whose statistics", "",
              "Eval mode, evaluation batch 256 (`evaluate.py`); PreciseBN re-estimates the "
              "statistics of the same weights from training images.", "",
              "| run | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for k, r in runs.items():
        lines.append(f"| {k} | " + " | ".join(f"{r['val_acc'][c]:.2f}" for c in cols) + " |")
    lines += ["", "## By layer", "", "![divergence by layer](rankstats.png)", "",
              "| # | layer | " + " | ".join(f"div_mean, {k}" for k in runs) + " |",
              "|---|---|" + "---|" * len(runs)]
    first = next(iter(runs.values()))
    for i, n in enumerate(first["layers"]):
        lines.append(f"| {i} | {n} | " + " | ".join(f"{r['div_mean'][i]:.3f}"
                                                    for r in runs.values()) + " |")
    v = verdict(res)
    lines += ["", f"**C7 verdict: {v.verdict}.** {v.why}", ""]
    return "\n".join(lines)


def verdict(res: dict) -> Verdict:
    runs = res["runs"]
    default = next(r for r in runs.values() if r["buffers"] == "on")
    parts, accs = [], []
    for k, r in runs.items():
        a = list(_rank_accs(r).values())
        accs.append(f"{k.split(', ')[-1]}: {min(a):.1f}-{max(a):.1f}%")
        parts.append(f"{k.split(', ')[-1]}: median layer {statistics.median(r['div_mean']):.2f} "
                     f"std (largest {max(r['div_mean']):.2f})")
    keeps = default["state_vs_rank"]
    only0 = keeps["rank 0"] == 0 and all(v > 0 for k, v in keeps.items() if k != "rank 0")
    wide = statistics.median(default["div_mean"]) >= WIDE
    ours = ("running means differ across ranks, " + "; ".join(parts)
            + f"; model state = rank 0's: {'yes' if only0 else 'no'}; val acc with one rank's "
            "statistics " + ", ".join(accs))
    v = "reproduced" if wide and only0 else "partly" if wide or only0 else "not reproduced"
    return Verdict("C7", "make table-rankstats", "running means differ widely across ranks; "
                   "the checkpoint keeps rank 0's", ours, v,
                   f"Rule: reproduced if, with torch's default buffer sync, the median layer's "
                   f"running means differ across ranks by {WIDE} running std or more and the "
                   "model state holds exactly rank 0's statistics (no other rank's); partly if "
                   "one of the two holds. Buffer sync sends rank 0's statistics to every rank "
                   "before each forward, so at the end the ranks differ by one update from "
                   "their own last batch; "
                   + ("with it on or off the checkpoint is identical (measured)."
                      if res["state_difference"] == 0 else
                      f"the two checkpoints differ by up to {res['state_difference']:.3g}."))


def plot(res: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, ax, what in [("div_mean", axes[0], "running mean: max |m_r - m_0| / std_0"),
                          ("div_logvar", axes[1], "running var: max |log v_r - log v_0|")]:
        for label, r in res["runs"].items():
            ax.plot(range(len(r[key])), r[key], marker="o", ms=3, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("BN layer (module order, stem to head)")
        ax.set_title(what, fontsize=10)
        ax.legend(fontsize=8)
    save(fig, path, "Divergence of the ranks' running statistics by depth (bn, 4x2)")


def verdicts(res: dict) -> list[Verdict]:
    return [verdict(res)]


TABLE = Table("rankstats", ("C7",), Context.results, table, verdicts, plot, measure=measure)
