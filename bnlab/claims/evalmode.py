"""`make table-evalmode` (claim C10): eval mode vs train mode, from trained checkpoints.

    python -m bnlab.claims evalmode --data DIR [--runs experiments/runs]  # train, evaluate, table
    python -m bnlab.claims evalmode --report                               # from results.json

Trains the missing runs of experiments/evalmode/sweep.yaml (bn and syncbn at 4x2 are
table-jitter's own runs), runs `evaluate.py` on each run's checkpoint (eval.json: eval-mode
accuracy at several evaluation batch sizes, train-mode accuracy at others), and shows on the
bn 4x2 checkpoint that train-mode forwards with no backward move the running statistics.
Everything measured goes to experiments/evalmode/results.json; table.md is built from it.
"""

from __future__ import annotations

import time
from pathlib import Path

from bnlab.lab.page import results_kernels
from bnlab.lab.plan import plan
from bnlab.lab.results import eval_json
from bnlab.lab.spec import data_tag
from bnlab.lab.table import Context, Table, Verdict

FORWARDS = 10  # train-mode forwards (no backward) in the demonstration


def stats_move(d: Path, runs: Path, forwards: int = FORWARDS, batch: int = 32) -> dict:
    """Train-mode forwards under no_grad on validation images: how far the running
    statistics move, and the eval-mode accuracy before and after (the run named under `runs`,
    as the evals are)."""
    import torch

    from bnlab.data import val_batches
    from bnlab.evaluation import load_trained

    run = load_trained(d)
    model, data = run.model, run.data
    before = {k: v.clone() for k, v in model.state_dict().items() if "running_" in k}
    acc0 = run.acc()
    model.train()
    with torch.no_grad():
        for i, (x, _) in enumerate(val_batches(data, data.val, run.env.device, batch, 1, 0)):
            if i == forwards:
                break
            model(x)
    after = {k: v for k, v in model.state_dict().items() if "running_" in k}
    rel = max(float(((after[k] - before[k]).abs() / (before[k].abs() + 1e-3)).max())
              for k in before)
    acc1 = run.acc()
    return {"run": str(d.relative_to(runs)),
            "forwards": forwards, "batch": batch, "acc_before": acc0, "acc_after": acc1,
            "max_relative_change": rel,
            "layers_changed": sum(not torch.equal(after[k], before[k]) for k in before),
            "buffers": len(before)}


def measure(ctx: Context) -> dict:
    spec, runs = ctx.spec(), ctx.runs
    tag = data_tag(spec.cells[0].cfg)
    evals, dirs = {}, {}
    for cell, seed, d in plan(spec, tag, runs):
        e = eval_json(d, "table-evalmode")
        evals[cell.label] = {"seed": seed, "run": str(d.relative_to(runs)), **e}
        dirs[cell.label] = d
    return {"date": time.strftime("%Y-%m-%d"), "tag": tag, "evals": evals,
            "moves": stats_move(dirs["bn 4x2"], runs)}


def table(res: dict) -> str:
    evals = res["evals"]
    keys = list(next(iter(evals.values()))["val_acc"])
    cols = [k for k in keys if k.startswith(("eval mode", "train mode"))]
    lines = ["# Eval mode vs train mode (C10)", "",
             TABLE.generated + " from "
             "`results.json`: `evaluate.py` on each run's final checkpoint "
             f"(data `{res['tag']}`, {res['date']}).", "", results_kernels(res), "",
             "| run | " + " | ".join(c.replace(", ", " ") for c in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for label, e in evals.items():
        lines.append(f"| {label} (seed {e['seed']}) | "
                     + " | ".join(f"{e['val_acc'][c]:.2f}" for c in cols) + " |")
    m = res["moves"]
    lines += ["", "Val acc (%). Eval mode uses the running statistics (batch size cannot "
              "matter); train mode normalizes each evaluation batch by its own statistics "
              "(on a copy of the model).", "",
              f"**A train-mode forward with no backward moves the running statistics.** On "
              f"the bn 4x2 checkpoint, {m['forwards']} forwards of {m['batch']} validation "
              f"images in train mode under `torch.no_grad()` changed {m['layers_changed']} of "
              f"{m['buffers']} running-statistics buffers (largest relative change "
              f"{m['max_relative_change']:.3g}); eval-mode val acc went from "
              f"{m['acc_before']:.2f}% to {m['acc_after']:.2f}%.", "",
              f"**C10 verdict: {(v := verdict(res)).verdict}.** {v.why}", ""]
    return "\n".join(lines)


def verdict(res: dict) -> Verdict:
    spread, small, big, holdouts = [], [], [], []
    for label, e in res["evals"].items():
        acc = e["val_acc"]
        ev = [v for k, v in acc.items() if k.startswith("eval mode")]
        spread.append(max(ev) - min(ev))
        small.append(acc["train mode, batch 2"] - acc["eval mode, batch 256"])
        big.append(acc["train mode, batch 256"] - acc["eval mode, batch 256"])
        if small[-1] > -5:
            holdouts.append(f"{label} ({small[-1]:+.1f})")
    m = res["moves"]
    ours = (f"eval-mode spread over batch sizes: up to {max(spread):.2f} pts; train mode at "
            f"batch 2 vs eval mode: {min(small):+.1f} to {max(small):+.1f} pts; at 256: "
            f"{min(big):+.1f} to {max(big):+.1f}; {m['layers_changed']}/{m['buffers']} "
            "buffers moved by no-grad train-mode forwards")
    flat = max(spread) < 0.01
    falls = max(small) <= -5
    moved = m["layers_changed"] > 0
    v = "reproduced" if flat and falls and moved else \
        "partly" if sum([flat, falls, moved]) >= 2 else "not reproduced"
    return Verdict("C10", "make table-evalmode", "eval mode batch-independent; train mode "
                   "falls apart at small batches; no-grad forwards move statistics", ours, v,
                   "Rule: reproduced if eval-mode accuracy is identical (< 0.01 pts) across "
                   "batch sizes, train mode at batch 2 is 5+ points below eval mode in every "
                   "run, and the no-grad train-mode forwards changed running statistics; "
                   "partly if two of the three hold."
                   + (f" Train mode at batch 2 within 5 points of eval mode: "
                      f"{', '.join(holdouts)}." if holdouts else ""))


def verdicts(res: dict) -> list[Verdict]:
    return [verdict(res)]


TABLE = Table("evalmode", ("C10",), Context.results, table, verdicts, measure=measure)
