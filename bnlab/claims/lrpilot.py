"""`make table-lrpilot`: the learning rate of the headline protocol, chosen by a stated rule.

    python -m bnlab.claims lrpilot --data DIR --jobs 2   # the pilot's runs, then the table
    python -m bnlab.claims lrpilot --report              # table from the runs' logs only

Trains experiments/lrpilot/sweep.yaml: syncbn at 4 ranks x 2 images with the headline
protocol's constant learning rate (configs/experiment/plateau.yaml), 5 epochs, seed 0, at each
candidate rate, on resnet20 and resnet18. `choice` applies the rule below; the plateau and
decompose sweeps use the rate it picks for each model (tests/claims/test_plateau.py checks
that they do). Writes experiments/lrpilot/{table.md, lrpilot.png}.

The rule, written before the pilot ran: a rate is *stable* when syncbn's run did not diverge,
its training loss (mean over each epoch) was lowest in its last epoch (still falling, no
blow-up), and its final val acc is at least STABLE_ACC (it learns). The protocol uses the
largest stable rate of each model; with none stable, the smallest candidate, said so.
"""

from __future__ import annotations

from pathlib import Path

from bnlab.lab import page, table
from bnlab.lab.figures import legend, plt, save
from bnlab.lab.results import CellResult, Run, fmt
from bnlab.lab.table import RunsData, Verdict

STABLE_ACC = 25.0  # final val acc (%) a stable rate must reach: 2.5x chance


def stable(run: Run) -> tuple[bool, str]:
    """Whether this pilot run trained stably, and the reason in words."""
    if run.diverged:
        return False, "diverged"
    _, losses = run.series("train_epoch/loss")
    if not losses:
        return False, "no epoch finished"
    if losses[-1] > min(losses):
        return False, f"train loss rose to {losses[-1]:.3f} from a low of {min(losses):.3f}"
    acc = run.accs[-1] if run.accs else None
    if acc is None or acc < STABLE_ACC:
        return False, f"final val acc {fmt(acc)}% < {STABLE_ACC:g}%"
    return True, f"loss falling to {losses[-1]:.3f}, final val acc {acc:.1f}%"


def group(meta: dict) -> str:
    """What one choice is made for: the model, and the optimizer where it is not SGD."""
    return meta["model"] + (f" {meta['optim']}" if meta.get("optim", "sgd") != "sgd" else "")


def by_model(d: RunsData) -> dict[str, list[CellResult]]:
    out: dict[str, list[CellResult]] = {}
    for c in d.cells:
        out.setdefault(group(c.cell.meta), []).append(c)
    return out


def choice(d: RunsData) -> dict[str, dict]:
    """Per model: the chosen `lr` (None until every candidate ran), and why."""
    out = {}
    for model, cells in by_model(d).items():
        if any(not c.runs for c in cells):
            out[model] = {"lr": None, "why": "not every candidate has run yet"}
            continue
        ok = [c.cell.meta["lr"] for c in cells if stable(c.runs[0])[0]]
        if ok:
            out[model] = {"lr": max(ok), "why": f"largest stable rate of {len(cells)} "
                          f"({', '.join(f'{x:g}' for x in sorted(ok))} stable)"}
        else:
            low = min(c.cell.meta["lr"] for c in cells)
            out[model] = {"lr": low, "why": "no candidate was stable: the smallest is used, "
                          "and the protocol's runs must be read with that in mind"}
    return out


def margin(d: RunsData, model: str, lr: float) -> str:
    """How far the chosen rate's run cleared the accuracy bar: a thin margin is a weak pick."""
    c = next(c for c in by_model(d)[model] if c.cell.meta["lr"] == lr)
    acc = c.runs[0].accs[-1] if c.runs and c.runs[0].accs else None
    return "" if acc is None else (f"; its final val acc {acc:.1f}% is {acc - STABLE_ACC:.1f} "
                                   f"points above the {STABLE_ACC:g}% bar")


def render(d: RunsData) -> str:
    rows = []
    for c in d.cells:
        r = c.runs[0] if c.runs else None
        ok, why = stable(r) if r else (None, "not run yet")
        losses = r.series("train_epoch/loss")[1] if r else []
        rows.append([group(c.cell.meta), f"{c.cell.meta['lr']:g}",
                     fmt(r.accs[-1]) if r and r.accs else "-",
                     " ".join(f"{x:.2f}" for x in losses) or "-",
                     {True: "yes", False: "no", None: "-"}[ok], why])
    picks = [f"- **{m}: lr {p['lr']:g}** ({p['why']}){margin(d, m, p['lr'])}"
             if p["lr"] else f"- **{m}: lr -** ({p['why']})" for m, p in choice(d).items()]
    return table.runs_page(d, "\n".join([
        page.md_table(["model", "lr", "final val acc (%)", "train loss by epoch", "stable",
                        "why"], rows), "",
        "The rate each model's headline runs use (experiments/plateau, experiments/decompose):",
        "", *picks, "",
        "Rule (bnlab/claims/lrpilot.py, written before these runs; it landed in commit 1fc01e2, "
        "after the 8 SGD runs: experiments/README.md): stable = did not "
        f"diverge, training loss lowest in the last epoch, final val acc >= {STABLE_ACC:g}%; "
        "the largest stable rate is used. One seed and 5 epochs: a pilot, not a result.", ""]))


def plot(d: RunsData, path: Path) -> None:
    models = by_model(d)
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.5), squeeze=False)
    for ax, (model, cells) in zip(axes[0], models.items(), strict=True):
        for c in cells:
            if c.runs:
                r = c.runs[0]
                ax.plot(r.epochs, r.accs, marker=".", label=f"lr {c.cell.meta['lr']:g}")
        ax.set(title=f"{model}, syncbn 4x2, seed 0", xlabel="epoch", ylabel="val accuracy (%)")
        ax.grid(alpha=0.3)
        legend(ax, 8)
    save(fig, path, "Learning-rate pilot: constant lr after half an epoch of warmup")


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # a choice of protocol, not a claim


TABLE = table.Table("lrpilot", (), table.runs_data, render, verdicts, plot, block="plateau")
