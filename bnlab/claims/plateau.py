"""`make table-plateau` (claims C1, C6, C9 on the headline protocol): jitter on the plateau,
detrended, beside the test set's floor, over 5 seeds.

    python -m bnlab.claims plateau --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims plateau --report              # table from the runs' logs only

Trains experiments/plateau/sweep.yaml: bn, syncbn, gn and frozen BN at 4 ranks x 2 images on
resnet20 and torchvision resnet18, with a constant learning rate after warmup (the rate
experiments/lrpilot chose for each model), 20 epochs evaluated 10 times each, every
evaluation's predictions kept (configs/experiment/plateau.yaml). Writes
experiments/plateau/{table.md, plateau.png}. The measures are bnlab/jitter.py's.

The rules below were written before these runs and landed in commit 1fc01e2
(experiments/README.md says which runs had finished by then). Each is applied to each model
and the claim's verdict combines them (COMBINE). The measure ruled on is the von Neumann sd of
val acc on the plateau (the second half of training): one evaluation's noise, blind to the
trend. Two cells differ only where their seeds separate: an exact one-sided permutation test
over the seeds at p <= SEPARATED (bnlab.lab.analysis.p_above); otherwise they are
"indistinguishable". The claims' swing is shown as the claimed quantity, never ruled on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnlab.jitter import PLATEAU
from bnlab.lab import table
from bnlab.lab.analysis import NO_LEARNING, SEPARATED, p_above
from bnlab.lab.figures import band, legend, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData, Verdict

MODELS = ("resnet20", "resnet18")
VARIANTS = ("adamw", "augmentation off")  # C4's settings, on C4_MODEL
C4_MODEL = "resnet20"
NORMS = ("bn", "syncbn", "gn", "frozen_bn")
MEASURE = "vn_sd"
MIN_SEEDS = 3  # seeds each cell needs before a rule applies (the test's smallest p is 1/20)
FLOOR_RATIO = 1.5  # bn's jitter above this multiple of its churn floor: quality moves
LANDED = "1fc01e2"  # the commit that landed these rules; a change after it is disclosed
STEADIEST = 1.1  # C9: gn's mean jitter at most this multiple of the lowest other cell's


def cell(d: RunsData, model: str, norm: str, variant: str | None = None) -> CellResult | None:
    """The cell of this model and norm; `variant`: one of C4's (VARIANTS), else the base."""
    return next((c for c in d.cells if c.cell.meta.get("model") == model
                 and c.cell.meta.get("norm") == norm and c.cell.meta.get("variant") == variant),
                None)


def vals(c: CellResult | None, key: str = MEASURE) -> list[float]:
    return [] if c is None else c.jitter_values(key)


def mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def shown(c: CellResult | None, key: str = MEASURE, digits: int = 2) -> str:
    return "-" if c is None else c.jstat(key).fmt(digits)


def status(*cells: CellResult | None) -> str | None:
    """None when every cell has MIN_SEEDS seeds with the measure; else why not: `not run yet`
    (fewer finished) or `untestable` (finished, but too many diverged)."""
    if any(c is None or len(c.runs) < MIN_SEEDS for c in cells):
        return "not run yet"
    if any(len(vals(c)) < MIN_SEEDS for c in cells):
        return "untestable"
    return None


def wait(model: str, why: str, *cells: CellResult | None) -> tuple[str, str]:
    """A model's outcome before its rule can apply, with the reason."""
    if why == "not run yet":
        return why, f"{model}: fewer than {MIN_SEEDS} seeds finished"
    lost = ", ".join(f"{c.cell.label} {c.diverged} of {len(c.runs)}" for c in cells
                     if c is not None and c.diverged)
    return why, f"{model}: fewer than {MIN_SEEDS} seeds left after divergence ({lost})"


def learned(c: CellResult) -> bool:
    """The cell learned on the plateau: its jitter has room to show."""
    return mean(vals(c, "plateau_acc")) >= NO_LEARNING + 5


def p_text(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"


# ----------------------------------------------------------------------------------------
# The table


COLUMNS = ["cell", "seeds", "plateau val acc (%)", "final val acc (%)", "swing (± pts)",
           "residual sd (pts)", "von Neumann sd (pts)", "churn floor (pts)", "jitter / floor",
           "log val-loss jitter", "churn (%)", "trend (pts/epoch)"]


def row(c: CellResult) -> list[str]:
    return [c.cell.label, c.seeds_note(), shown(c, "plateau_acc", 1), shown(c, "final", 1),
            shown(c, "swing", 1), shown(c, "residual_sd"), shown(c), shown(c, "churn_floor"),
            shown(c, "over_floor"), shown(c, "loss_jitter"), shown(c, "churn", 1),
            shown(c, "slope")]


def render(d: RunsData) -> str:
    lines = []
    for model in MODELS:
        cells = [c for c in d.cells if c.cell.meta.get("model") == model]
        if not cells:
            continue
        lr = cells[0].cell.cfg["optim"]["lr"]
        lines += [f"## {model}, 4 ranks x 2 images, lr {lr:g} constant", "",
                  table.md_table(COLUMNS, [row(c) for c in cells]), "",
                  separation(d, model), ""]
    n = next((len(c.runs[0].predictions[0]) for c in d.cells if c.runs
              and c.runs[0].predictions), None)
    lines += [NOTE.format(start=PLATEAU, n=n or "the"), ""]
    return table.runs_page(d, "\n".join(lines))


NOTE = (
    "All measures on the plateau window: the evaluations after the first {start:.0%} of "
    "training (bnlab/jitter.py). Swing: half the range there, the claims' \"+/- points\" (it "
    "grows with any trend and with the window's length). Residual sd: sd around a fitted "
    "line. Von Neumann sd: sqrt(mean squared successive difference / 2), the noise of one "
    "evaluation, which the rules use. Churn floor: the von Neumann sd that the observed "
    "prediction flips alone would give on {n} test images if every flip were a fair coin "
    "between right and wrong (quality unchanged); jitter / floor well above 1 means the "
    "model's quality itself moves between evaluations. Churn: share of test images whose "
    "predicted class changes between consecutive evaluations. Log val-loss jitter: von "
    "Neumann sd of log val loss. Mean ± sd over seeds.")


def separation(d: RunsData, model: str) -> str:
    """The pairwise tests the rules use, as one line."""
    bn, sb, gn, fr = (cell(d, model, n) for n in NORMS)
    parts = []
    for name, a, b in (("bn above syncbn", bn, sb), ("bn above frozen_bn", bn, fr),
                       ("bn above gn", bn, gn), ("gn above syncbn", gn, sb)):
        parts.append(f"{name} p = {p_text(p_above(vals(a), vals(b)))}")
    return ("Seeds told apart (exact one-sided permutation test on the von Neumann sd, "
            f"p <= {SEPARATED} separates): " + "; ".join(parts) + ".")


def plot(d: RunsData, path: Path) -> None:
    models = [m for m in MODELS if any(c.cell.meta.get("model") == m for c in d.cells)]
    fig, axes = plt.subplots(2, len(models), figsize=(7 * len(models), 9), squeeze=False)
    for j, model in enumerate(models):
        cells = [c for c in d.cells if c.cell.meta.get("model") == model]
        ax = axes[0][j]
        for c in cells:
            band(ax, c)
        ax.axvline(PLATEAU * (cells[0].epochs if cells else 1), color="grey", ls=":", lw=1)
        ax.set(title=f"{model}: val acc (mean, band = min..max over seeds); plateau right of "
               "the dotted line", xlabel="epoch", ylabel="val accuracy (%)")
        ax.grid(alpha=0.3)
        legend(ax, 8)
        ax = axes[1][j]
        for i, c in enumerate(cells):
            v, f = vals(c), vals(c, "churn_floor")
            ax.scatter([i] * len(v), v, color=f"C{i}", zorder=3, label="von Neumann sd"
                       if i == 0 else None)
            if f:
                ax.scatter([i] * len(f), f, marker="_", s=300, color="black", zorder=2,
                           label="churn floor" if i == 0 else None)
        ax.set_xticks(range(len(cells)), [c.cell.label for c in cells], fontsize=8)
        ax.set(title=f"{model}: jitter per seed on the plateau, beside its churn floor",
               ylabel="points")
        ax.grid(alpha=0.3, axis="y")
        legend(ax, 8)
    save(fig, path, "Headline protocol: constant lr, 20 epochs, 10 evaluations per epoch")


# ----------------------------------------------------------------------------------------
# The rules (written before the runs): each model's outcome, then the claim's verdict


COMBINE = ("Across models: reproduced on every model it could be tested on -> reproduced; on "
           "some, or partly on any -> partly; otherwise not reproduced (a model without "
           f"{MIN_SEEDS} finished seeds, or whose cells did not learn, is left out).")


def combine(outcomes: dict[str, str]) -> str:
    """The claim's verdict from each model's outcome, by COMBINE (models without enough seeds
    are left out)."""
    got = [o for o in outcomes.values() if o not in ("not run yet", "untestable")]
    if not got:
        return "untestable" if "untestable" in outcomes.values() else "not run yet"
    if all(o == "reproduced" for o in got):
        return "reproduced"
    if any(o in ("reproduced", "partly") for o in got):
        return "partly"
    return "not reproduced"


def c1_model(d: RunsData, model: str) -> tuple[str, str]:
    outcome, _, text = c1_both(d, model)
    return outcome, text


def c1_both(d: RunsData, model: str) -> tuple[str, str, str]:
    """C1 on one model: (outcome, the outcome by the rule of LANDED, text)."""
    bn, sb = cell(d, model, "bn"), cell(d, model, "syncbn")
    if why := status(bn, sb):
        o, t = wait(model, why, bn, sb)
        return o, o, t
    a, b = vals(bn), vals(sb)
    ratio, p = mean(a) / max(mean(b), 1e-9), p_above(a, b)
    over = mean(vals(bn, "over_floor"))
    text = (f"{model}: von Neumann sd bn {shown(bn)}, syncbn {shown(sb)} ({ratio:.1f}x, p = "
            f"{p_text(p)}); bn at {fmt(over, 1)}x its churn floor; swing bn ±"
            f"{shown(bn, 'swing', 1)}, syncbn ±{shown(sb, 'swing', 1)}")
    if not learned(sb):
        return "untestable", "untestable", text + " (syncbn does not learn)"
    if p > SEPARATED:
        v = "not reproduced"
    elif ratio >= 2 and over is not None and over >= FLOOR_RATIO:
        v = "reproduced"
    else:
        v = "partly"
    if not learned(bn):  # added after LANDED: the rule there gives v
        return "untestable", v, text + (f" (bn does not learn: no room to jitter; the rule "
                                        f"of {LANDED}, which checked only syncbn, gives {v})")
    return v, v, text + (" (indistinguishable)" if v == "not reproduced" else "")


def per_model(d: RunsData, claim: str, claimed: str, outcome, rule: str) -> Verdict:
    """A claim ruled on each model by `outcome` (d, model) -> (outcome, text), combined by
    COMBINE; `rule` is the rule's text."""
    out = {m: outcome(d, m) for m in MODELS}
    return Verdict(claim, "make table-plateau", claimed, "; ".join(t for _, t in out.values()),
                   combine({m: o for m, (o, _) in out.items()}),
                   f"Per model: {', '.join(f'{m} {o}' for m, (o, _) in out.items())}. Rule: "
                   + rule)


def c1(d: RunsData) -> Verdict:
    return per_model(
        d, "C1", "bn ±10, syncbn ±2", c1_model,
        "bn's plateau jitter (von Neumann sd) separated above syncbn's (p <= "
        f"{SEPARATED}) and >= 2x it, with bn >= {FLOOR_RATIO}x its churn floor: reproduced; "
        "separated, but under 2x "
        "or under that floor: partly; not separated: not reproduced (indistinguishable); bn "
        f"or syncbn below {NO_LEARNING + 5:g}% on the plateau: untestable. " + COMBINE +
        f" Changed after {LANDED}, with only seed 0 of resnet20 seen: a bn cell that does not "
        "learn makes its model untestable (the rule there checked only syncbn); where that "
        "applies, the model's text says what the old rule gives.")


def c6_model(d: RunsData, model: str) -> tuple[str, str]:
    bn, fr = cell(d, model, "bn"), cell(d, model, "frozen_bn")
    if why := status(bn, fr):
        return wait(model, why, bn, fr)
    a, b = vals(bn), vals(fr)
    p = p_above(a, b)
    text = (f"{model}: von Neumann sd bn {shown(bn)}, frozen {shown(fr)} (p = {p_text(p)}); "
            f"plateau acc {shown(bn, 'plateau_acc', 1)} vs {shown(fr, 'plateau_acc', 1)}")
    if not learned(fr):
        return "untestable", text + " (frozen BN does not learn: no room to jitter)"
    if p > SEPARATED:
        return "not reproduced", text + " (indistinguishable)"
    return ("reproduced" if mean(b) <= mean(a) / 2 else "partly"), text


def c6(d: RunsData) -> Verdict:
    return per_model(d, "C6", "frozen BN much steadier", c6_model,
                     f"bn's jitter separated above frozen BN's (p <= {SEPARATED}) and frozen at "
                   "most half of it: reproduced; separated: partly; else not reproduced; frozen "
                   f"BN below {NO_LEARNING + 5:g}% on the plateau: untestable. " + COMBINE)


def c9_model(d: RunsData, model: str) -> tuple[str, str]:
    gn = cell(d, model, "gn")
    others = {n: cell(d, model, n) for n in ("bn", "syncbn", "frozen_bn")}
    if why := status(gn, *others.values()):
        return wait(model, why, gn, *others.values())
    above = {n: p_above(vals(gn), vals(c)) for n, c in others.items()}
    below_bn = p_above(vals(others["bn"]), vals(gn))
    old_steadiest = all(p > SEPARATED for p in above.values()) and below_bn <= SEPARATED
    lowest = min(mean(vals(c)) for c in others.values())
    steadiest = old_steadiest and mean(vals(gn)) <= STEADIEST * lowest
    gap = mean(vals(others["syncbn"], "plateau_acc")) - mean(vals(gn, "plateau_acc"))
    close = abs(gap) <= 5
    text = (f"{model}: von Neumann sd gn {shown(gn)}, syncbn {shown(others['syncbn'])}, bn "
            f"{shown(others['bn'])}, frozen {shown(others['frozen_bn'])}; gn above any p >= "
            f"{min(above.values()):.3f}, below bn p = {p_text(below_bn)}; plateau acc gn "
            f"{-gap:+.1f} points against syncbn")
    if not learned(gn):
        return "untestable", text + " (gn does not learn: no room to jitter)"
    v = "reproduced" if steadiest and close else "partly" if steadiest or close else \
        "not reproduced"
    old_close = gap <= 5
    old = "reproduced" if old_steadiest and old_close else "partly" if old_steadiest or \
        old_close else "not reproduced"
    if old != v:
        text += f" (the rule of {LANDED} gives {old})"
    return v, text


def c9(d: RunsData) -> Verdict:
    return per_model(d, "C9", "GN steadiest, close to SyncBN", c9_model,
                     f"steadiest = gn's jitter not separated above any other cell's, separated "
                   f"below bn's (p <= {SEPARATED}) and on average at most {STEADIEST}x the "
                   "lowest other cell's; close = plateau val acc within 5 points of syncbn's, "
                   f"either way; both: reproduced, one: partly; gn below {NO_LEARNING + 5:g}% "
                   f"on the plateau: untestable. " + COMBINE + f" Changed after {LANDED}, "
                   f"before any gn run: the {STEADIEST}x bound and the two-sided 5 points were "
                   "added (where the rule there differs, the model's text says what it gives).")


def c4(d: RunsData) -> Verdict:
    """C4 says C1's effect survives another optimizer and no augmentation: ruled only where
    C1's effect exists (on C4_MODEL), each variant like C1 but at 1.5x."""
    base, old_base, _ = c1_both(d, C4_MODEL)
    parts, out = [], {}
    for variant in VARIANTS:
        bn, sb = cell(d, C4_MODEL, "bn", variant), cell(d, C4_MODEL, "syncbn", variant)
        if why := status(bn, sb):
            out[variant] = why
            parts.append(wait(f"{variant}", why, bn, sb)[1])
            continue
        a, b = vals(bn), vals(sb)
        ratio, p = mean(a) / max(mean(b), 1e-9), p_above(a, b)
        out[variant] = "survives" if p <= SEPARATED and ratio >= 1.5 else "gone"
        parts.append(f"{variant}: von Neumann sd bn {shown(bn)}, syncbn {shown(sb)} "
                     f"({ratio:.1f}x, p = {p_text(p)})")
    rule = (f"Rule (on {C4_MODEL}, where C1 is ruled first): C1's effect must exist there "
            "(reproduced or partly), else untestable; in each variant the effect survives if "
            f"bn's jitter is separated above syncbn's (p <= {SEPARATED}) and >= 1.5x it; "
            "reproduced if it survives in both, partly in one, else not reproduced.")
    v = c4_outcome(base, out)
    if base not in ("not run yet", "reproduced", "partly"):
        rule += f" C1 on {C4_MODEL}: {base}, so there is no effect to survive."
    if old_base != base:  # C1's rule changed after LANDED
        rule += (f" With C1's rule of {LANDED} (C1 on {C4_MODEL}: {old_base}), C4 gives "
                 f"{c4_outcome(old_base, out)}.")
    return Verdict("C4", "make table-plateau", "aug off / other optimizer do not remove it",
                   "; ".join(parts), v, rule)


def c4_outcome(base: str, out: dict[str, str]) -> str:
    """C4 from C1's outcome on C4_MODEL and each variant's (survives, gone, or why not). Without
    C1's effect there, C4 is untestable whatever its own cells show, so it waits only for C1."""
    if base == "not run yet":
        return "not run yet"
    if base not in ("reproduced", "partly"):
        return "untestable"
    if "not run yet" in out.values():
        return "not run yet"
    if "untestable" in out.values():
        return "untestable"
    n = sum(o == "survives" for o in out.values())
    return "reproduced" if n == len(VARIANTS) else "partly" if n else "not reproduced"


def verdicts(d: RunsData) -> list[Verdict]:
    return [c1(d), c4(d), c6(d), c9(d)]


TABLE = table.Table("plateau", ("C1", "C4", "C6", "C9"), table.runs_data, render, verdicts,
                    plot, block="plateau", headline="plateau.png")
