"""`make table-jitter` (claims C1, C4, C6, C8, C9): val acc jitter at 4 ranks x 2 images.

    python -m bnlab.claims jitter --data DIR --jobs 2   # sweep, real-DDP check, table
    python -m bnlab.claims jitter --report              # table from the runs' logs only

Trains experiments/jitter/sweep.yaml (bn, syncbn, gn, ln, frozen BN, PreciseBN every epoch,
C4's variants, resnet18_cifar, and the key cells as real gloo processes), measures the first
steps of real DDP against the simulation (bnlab/claims/ddpcheck.py, kept in ddpcheck.json)
and writes experiments/jitter/{table.md, jitter.png}.
"""

from __future__ import annotations

from pathlib import Path

from bnlab.lab import table
from bnlab.lab.analysis import NO_LEARNING, Stat
from bnlab.lab.figures import band, legend, mean_loss, plt, precise_points, save
from bnlab.lab.results import CellResult, fmt, mean_of, missing, shown_stat, side_by_side
from bnlab.lab.table import RunsData, Verdict

TITLES = {"main": "4 ranks x 2 images, torchvision resnet18",
          "C4": "C4: augmentation off, and the reports' exact learning rate",
          "cifar_stem": "resnet18_cifar (3x3 stem, no max-pool)"}


def sections(d: RunsData) -> dict[str, list[CellResult]]:
    """The cells by the spec's `section` (main, C4, cifar_stem, ddp)."""
    out: dict[str, list[CellResult]] = {}
    for c in d.cells:
        out.setdefault(c.cell.meta.get("section", "main"), []).append(c)
    return out


# ----------------------------------------------------------------------------------------
# The table


def render(d: RunsData) -> str:
    by_section = sections(d)
    lines = []
    for sec in ("main", "C4", "cifar_stem"):
        rows = [[c.cell.label, *table.metric_cells(c)] for c in by_section.get(sec, [])]
        if sec == "main":
            pb = [c for c in by_section.get(sec, []) if c.stat("precise").n]
            extra = [f"- PreciseBN row, val acc after the last recalibration: "
                     f"{c.stat('precise').fmt()} (the row's val acc columns are the EMA "
                     "statistics' before it)" for c in pb]
        else:
            extra = []
        if rows:
            lines += [f"## {TITLES[sec]}", "",
                      table.md_table(["row", *table.METRIC_HEADER], rows), "", *extra, ""]
    ddp = by_section.get("ddp", [])
    if ddp:
        lines += ["## Simulation vs real DDP (4 gloo processes), seed 0", "",
                  "The same cell re-run as 4 real processes for its first epoch; the "
                  "simulation's run is the table's row. fp32 rounding differs between the two "
                  "layouts, so the runs are expected to agree closely at first and then drift "
                  "apart chaotically (see README, Simulated ranks).", "",
                  ddp_table(ddp, d.cells), ""]
    from bnlab.claims import ddpcheck  # here, so `python -m bnlab.claims.ddpcheck` runs once

    lines += [ddpcheck.section(d.out / ddpcheck.SAVED), table.SWING_NOTE, ""]
    return table.runs_page(d, "\n".join(lines))


def ddp_table(ddp: list[CellResult], cells: list[CellResult]) -> str:
    by_label = {c.cell.label: c for c in cells}
    rows = []
    for c in ddp:
        sim = by_label.get(c.cell.meta["compare"])
        real_run = c.runs[0] if c.runs else None
        sim_run = next((r for r in (sim.runs if sim else []) if r.seed == 0), None)
        if real_run is None or sim_run is None:
            rows.append([c.cell.label, "not run yet", "", "", "", ""])
            continue
        stop = real_run.last("step")
        sim_loss = {r["step"]: r["train/loss"] for r in sim_run.rows
                    if "train/loss" in r and r["step"] <= stop}
        real_loss = {r["step"]: r["train/loss"] for r in real_run.rows if "train/loss" in r}
        common = sorted(set(sim_loss) & set(real_loss))
        first = common[0]
        diffs = [abs(sim_loss[s] - real_loss[s]) for s in common]
        sim_acc = [a for e, a in zip(sim_run.epochs, sim_run.accs, strict=True)
                   if e <= real_run.epochs[-1] + 1e-9]
        rows.append([c.cell.label, str(stop),
                     f"{sim_loss[first]:.4f} / {real_loss[first]:.4f}",
                     f"{max(diffs):.3f}",
                     " ".join(fmt(a) for a in sim_acc) + " / "
                     + " ".join(fmt(a) for a in real_run.accs),
                     f"{sim_acc[-1] - real_run.accs[-1]:+.1f}" if sim_acc else "-"])
    return table.md_table(["cell", "steps", "train loss at first log, sim / real",
                     "max abs loss diff over logs", "val acc at each eval, sim / real",
                     "last val acc diff (pts)"], rows)


def plot(d: RunsData, path: Path) -> None:
    by_section = sections(d)
    main = by_section.get("main", [])
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for c in main:
        if not precise_points(axes[0], c):
            band(axes[0], c)
            mean_loss(axes[2], c)
    base = [c for c in main if c.cell.label in ("bn", "syncbn")]
    for c in base + by_section.get("C4", []) + by_section.get("cifar_stem", []):
        band(axes[1], c)
    axes[0].set_title("4 ranks x 2 images: val acc (mean, band = min..max over seeds)")
    axes[1].set_title("C4 variants and resnet18_cifar beside bn / syncbn")
    axes[2].set_title("train loss (mean over every step and rank)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        legend(ax, 7)
    axes[0].set_ylabel("val accuracy (%)")
    axes[1].set_ylabel("val accuracy (%)")
    save(fig, path, "Jitter under DDP with 2 images per rank (CIFAR-10)")


# ----------------------------------------------------------------------------------------
# The rules: each claim's verdict from the cells (label -> CellResult)


def c1(j: dict[str, CellResult]) -> Verdict:
    bn, sb = j.get("bn"), j.get("syncbn")
    a, b = mean_of(bn, "swing"), mean_of(sb, "swing")
    ours = "resnet18: " + side_by_side(bn, sb, "bn", "syncbn")
    cbn, csb = j.get("resnet18_cifar bn"), j.get("resnet18_cifar syncbn")
    if mean_of(cbn, "swing") is not None or mean_of(csb, "swing") is not None:
        ours += f"; resnet18_cifar: swing bn ±{shown_stat(cbn)}, syncbn ±{shown_stat(csb)}"
    if missing(a, b):
        return Verdict("C1", "make table-jitter", "bn ±10, syncbn ±2", ours, "not run yet", "")
    ratio = a / max(b, 1e-9)
    v = "reproduced" if ratio >= 2 and a >= 5 else "partly" if ratio >= 1.5 else \
        "not reproduced"
    why = (f"bn swings {ratio:.1f}x as much as syncbn (rule: reproduced if >= 2x and bn >= ±5; "
           "partly if >= 1.5x).")
    fa = mean_of(bn, "final")
    if fa is not None and fa < NO_LEARNING + 5:
        why += (f" bn at 4x2 barely learns here (final val acc {fa:.1f}%), so its accuracy has "
                "little room to swing: with torchvision's ImageNet stem a 32x32 image is 1x1 in "
                "layer4, where BN normalizes over 2 values per channel.")
    ca, cb, cf = mean_of(cbn, "swing"), mean_of(csb, "swing"), mean_of(cbn, "final")
    if not missing(ca, cb, cf):
        why += (f" With resnet18_cifar (layer4 4x4), where bn learns (final val acc {cf:.1f}%), "
                f"bn swings {ca / max(cb, 1e-9):.1f}x as much as syncbn (not ruled on).")
    return Verdict("C1", "make table-jitter", "bn ±10, syncbn ±2", ours, v, why)


def c4(j: dict[str, CellResult]) -> Verdict:
    pairs = {"augmentation off": ("bn, augmentation off", "syncbn, augmentation off"),
             "lr 0.1": ("bn, reports' setting (lr 0.1 constant)",
                        "syncbn, reports' setting (lr 0.1 constant)")}
    parts, outcomes = [], []
    for name, (bl, sl) in pairs.items():
        bn, sb = j.get(bl), j.get(sl)
        a, b = mean_of(bn, "swing"), mean_of(sb, "swing")
        fa, fb = mean_of(bn, "final"), mean_of(sb, "final")
        if missing(a, b, fa, fb):
            parts.append(f"{name}: not run yet")
            outcomes.append(None)
            continue
        parts.append(f"{name}: swing bn ±{shown_stat(bn)}, syncbn ±{shown_stat(sb)} (final acc "
                     f"{fa:.1f} / {fb:.1f})")
        if fb < NO_LEARNING:
            outcomes.append("untestable")
        else:
            outcomes.append(a >= 1.5 * b)
    if None in outcomes:
        v, why = "not run yet", ""
    elif outcomes == [True, True]:
        v, why = "reproduced", "bn swings >= 1.5x syncbn in both variants."
    elif True in outcomes:
        v = "partly"
        why = ("the effect survives with augmentation off; at lr 0.1 "
               + ("syncbn does not learn either, so the swing there says nothing"
                  if outcomes[1] == "untestable" else "it does not") + ".") \
            if outcomes[0] is True else "the effect survives only at lr 0.1."
    else:
        v, why = "not reproduced", "bn does not swing >= 1.5x syncbn in the variants."
    return Verdict("C4", "make table-jitter", "aug off / other lr do not remove it",
                   "; ".join(parts), v, why)


def c6(j: dict[str, CellResult]) -> Verdict:
    bn, fr = j.get("bn"), j.get("frozen_bn (after epoch 1)")
    a, b = mean_of(bn, "swing"), mean_of(fr, "swing")
    ours = side_by_side(bn, fr, "bn", "frozen")
    if missing(a, b):
        return Verdict("C6", "make table-jitter", "frozen BN much steadier", ours,
                       "not run yet", "")
    v = "reproduced" if b <= a / 2 else "partly" if b < a else "not reproduced"
    return Verdict("C6", "make table-jitter", "frozen BN much steadier", ours, v,
                   "Rule: reproduced if frozen BN halves the swing; partly if it lowers it.")


def c8(j: dict[str, CellResult]) -> Verdict:
    pb = j.get("bn + PreciseBN every epoch")
    gains = pb.paired("precise", "final") if pb is not None else []
    g = Stat.of(gains)
    ours = f"final acc with EMA statistics {shown_stat(pb, 'final')}, after PreciseBN " \
           f"{shown_stat(pb, 'precise')}; gain on the same weights, per seed: " + \
           (", ".join(f"{d:+.1f}" for d in gains) or "-") + \
           ("" if g.mean is None else f" (mean {g.mean:+.1f}" +
            (f" ± {g.std:.1f})" if g.std is not None else ")"))
    if g.mean is None:
        return Verdict("C8", "make table-jitter", "PreciseBN improves val acc", ours,
                       "not run yet", "")
    up = sum(d > 0 for d in gains)
    v = "reproduced" if g.mean >= 1 and up == len(gains) else \
        "partly" if g.mean > 0 and up > len(gains) / 2 else "not reproduced"
    # Disclosed: this rule replaced, after the data was seen, one on the difference of the
    # two means over seeds (commit 92543d7).
    d = mean_of(pb, "precise") - mean_of(pb, "final")
    old = "reproduced" if d >= 1 else "partly" if d > 0 else "not reproduced"
    return Verdict("C8", "make table-jitter", "PreciseBN improves val acc", ours, v,
                   f"PreciseBN raised the final val acc in {up} of {len(gains)} seeds, by "
                   f"{g.mean:+.1f} points on average (rule, on each seed's own weights: "
                   "reproduced if +1 or more on average and up in every seed; partly if up on "
                   "average and in most seeds). This rule was written after the data was seen "
                   "(commit 92543d7); the rule before it (difference of the means over seeds: "
                   f">= +1 reproduced, > 0 partly) gives {old} ({d:+.1f}). Tested only on bn, "
                   "which barely learns in this protocol.")


def c9(j: dict[str, CellResult]) -> Verdict:
    gn, sb, bn = j.get("gn (32 groups)"), j.get("syncbn"), j.get("bn")
    g, s, b = mean_of(gn, "swing"), mean_of(sb, "swing"), mean_of(bn, "swing")
    fg, fs = mean_of(gn, "final"), mean_of(sb, "final")
    ours = f"swing gn ±{shown_stat(gn)}, syncbn ±{shown_stat(sb)}, bn ±{shown_stat(bn)}; " \
           f"final acc gn {shown_stat(gn, 'final')} vs syncbn {shown_stat(sb, 'final')}"
    if missing(g, s, b, fg, fs):
        return Verdict("C9", "make table-jitter", "GN steadiest, close to SyncBN", ours,
                       "not run yet", "")
    steady = g <= min(s, b) * 1.1
    close = fs - fg <= 5
    v = "reproduced" if steady and close else "partly" if steady or close else \
        "not reproduced"
    return Verdict("C9", "make table-jitter", "GN steadiest, close to SyncBN", ours, v,
                   "Rule: steadiest = swing within 10% of the lowest of bn and syncbn; close "
                   f"= within 5 points of syncbn's final acc. Steadiest: {steady}, close: "
                   f"{close}.")


# Claims ruled again on the headline protocol, and the table that rules them there.
HEADLINE = {"C1": "table-plateau", "C4": "table-plateau", "C6": "table-plateau",
            "C9": "table-plateau", "C8": "table-decompose"}


def verdicts(d: RunsData) -> list[Verdict]:
    j = d.by_label
    out = [rule(j) for rule in (c1, c4, c6, c8, c9)]
    for v in out:
        if v.claim in HEADLINE:
            v.why = ("Short protocol (5 epochs, cosine decay: the window still rises, so the "
                     "swing is mostly trend); the verdict on the headline protocol is "
                     f"{HEADLINE[v.claim]}'s. " + v.why)
    return out


def measure(ctx) -> dict:
    """The real-DDP check on the spec's bn and syncbn cells (ddpcheck.json)."""
    from bnlab.claims import ddpcheck

    res = ddpcheck.measure(ctx.data, ddpcheck.STEPS)
    print(ddpcheck.table(res))
    return res


TABLE = table.Table("jitter", ("C1", "C4", "C6", "C8", "C9"), table.runs_data, render, verdicts,
                    plot, measure=measure, saved="ddpcheck.json", block="claims")
