"""`make table-values`: where BatchNorm breaks. Accuracy and jitter against the values each BN
channel normalizes over, with the number of samples separated from the number of values.

    python -m bnlab.claims values --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims values --report              # table from the runs' logs only

Trains experiments/values/sweep.yaml: one global batch of 8 images, one learning rate (the
pilot's, experiments/pilot), one data order (the seed's); only how BN groups the images
changes: 4 ranks x 2, 2 x 4, 1 x 8 (simulated; 1 x 8 with bn computes exactly what syncbn at
4 x 2 does, so it is each model's reference). And the values per image at the smallest BN map:
torchvision resnet18 on 32 px images (1x1 in layer4), the same model on images resized to
64 px (data.image_size=64: 2x2), and resnet20 (8x8). Each cell's smallest layer normalizes over
images per rank x map area values per channel (run.json's bn_values_per_channel): 2, 4, 8 at
32 px; 8, 16, 32 at 64 px; 128, 256, 512 on resnet20. 8 values are reached from 2 images (64
px) and from 8 (32 px). Every cell runs the settled headline protocol
(configs/experiment/headline.yaml) shortened to 10 epochs for every cell (the budget: the
64 px cells cost about 4 times the 32 px ones), the plateau its second half, 3 seeds. Writes
experiments/values/{table.md, values.png}.

The rules, written before these runs (experiments/README.md names the commit):

- A cell's *gap* is its reference's plateau accuracy minus its own, paired on the seed (the
  same initial weights and data order), with a 95% t interval over the seeds. The cell
  *breaks* when the gap is >= BREAK points and its interval excludes 0; it *holds* when the
  gap is under BREAK points; otherwise it is *unclear*. Its *jitter ratio* is its plateau
  jitter (von Neumann sd) over its reference's, with a 95% bootstrap interval.
- What governs the collapse, from the 2-images-per-rank cells (2, 8 and 128 values):
  no cell breaks: "BN does not break in this range"; the 2-value cell breaks and the 8-value
  cell (2 images at 64 px, the level the 32 px reference reaches with 8 images) holds:
  "values govern"; every 2-image cell breaks: "samples govern"; the 2- and 8-value cells
  break and the 128-value one holds: "both" (values help, but 8 values from 2 images break
  where 8 from 8 images is the reference); any other pattern (an unclear cell among them):
  "undecided".
- The doctor's thresholds (a BN layer is at risk below MIN_IMAGES images or MIN_VALUES values
  per channel per rank; the trainer's warning uses the same rule): supported when every
  breaking cell is flagged and no holding cell is. Where they are not, the table gives the
  values threshold the data support: the range above every breaking cell's values and at or
  below every holding cell's above them, and whether a samples threshold is needed at all (a
  holding cell with 2 images per rank says it is not). The doctor is then changed to it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from bnlab.doctor import MIN_IMAGES, MIN_VALUES
from bnlab.lab import page, table
from bnlab.lab.analysis import mean_interval, ratio_interval
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData, Verdict

BREAK = 2.0  # points of accuracy lost to the reference at which a cell breaks
MIN_SEEDS = 3
MARKERS = {2: "o", 4: "s", 8: "^"}


def groups(d: RunsData) -> dict[str, list[CellResult]]:
    """Cells by input (model and image size), the reference (1 x 8) last."""
    out: dict[str, list[CellResult]] = {}
    for c in d.cells:
        out.setdefault(c.cell.meta["input"], []).append(c)
    return out


def reference(d: RunsData, c: CellResult) -> CellResult:
    return next(r for r in groups(d)[c.cell.meta["input"]] if r.cell.meta["per_rank"] == 8)


def values(c: CellResult) -> int | None:
    """Values per channel at the cell's smallest BN layer, from its runs' run.json."""
    for r in c.runs:
        counts = r.info.get("bn_values_per_channel")
        if counts:
            return min(counts.values())
    return None


def ready(c: CellResult) -> bool:
    return len(c.runs) >= min(MIN_SEEDS, c.expected)


def paired(c: CellResult, ref: CellResult, key: str) -> list[float]:
    """ref - c of a jitter measure, on each seed both have."""
    mine = {r.seed: r.jitter(c.epochs).get(key) for r in c.runs}
    theirs = {r.seed: r.jitter(ref.epochs).get(key) for r in ref.runs}
    return [theirs[s] - mine[s] for s in sorted(mine) if s in theirs
            and mine[s] is not None and theirs[s] is not None]


def measure(d: RunsData, c: CellResult) -> dict | None:
    """The cell against its reference: gap (with interval), jitter ratio, state; None until
    both have MIN_SEEDS seeds."""
    ref = reference(d, c)
    if not (ready(c) and ready(ref)):
        return None
    gaps = paired(c, ref, "plateau_acc") if c is not ref else [0.0] * len(c.runs)
    lo, hi = mean_interval(gaps)
    gap = float(np.mean(gaps)) if gaps else math.nan
    j = c.jitter_values("vn_sd")
    jr = float(np.mean(j) / np.mean(ref.jitter_values("vn_sd"))) if j else math.nan
    jlo, jhi = ratio_interval(j, ref.jitter_values("vn_sd")) if c is not ref else (None, None)
    if c is ref:
        state = "reference"
    elif c.diverged:
        state = "breaks"  # a seed diverged: as far from its reference as it gets
    elif gap >= BREAK and lo is not None and lo > 0:
        state = "breaks"
    elif gap < BREAK:
        state = "holds"
    else:
        state = "unclear"
    return {"values": values(c), "images": c.cell.meta["per_rank"], "gap": gap, "lo": lo,
            "hi": hi, "jitter": jr, "jlo": jlo, "jhi": jhi, "state": state,
            "acc": c.jstat("plateau_acc"), "vn": c.jstat("vn_sd")}


def measured(d: RunsData) -> list[tuple[CellResult, dict]]:
    return [(c, m) for c in d.cells if (m := measure(d, c)) is not None]


def governs(d: RunsData) -> tuple[str, str]:
    """(answer, the 2-image cells in words) by the rule."""
    two = sorted(((m["values"], m["state"]) for c, m in measured(d) if m["images"] == 2),
                 key=lambda x: x[0])
    expected = sum(c.cell.meta["per_rank"] == 2 for c in d.cells)
    words = ", ".join(f"{v} values {s}" for v, s in two)
    if len(two) < expected:
        return "not run yet", words
    states = [s for _, s in two]
    if all(s == "holds" for s in states):  # an unclear one among them: undecided, below
        return "BN does not break in this range", words
    by = dict(two)
    if by.get(2) == "breaks" and by.get(8) == "holds":
        return "values govern", words
    if all(s == "breaks" for s in states):
        return "samples govern", words
    if by.get(2) == "breaks" and by.get(8) == "breaks" and states[-1] == "holds":
        return "both", words
    return "undecided", words


def flagged(m: dict) -> bool:
    """The doctor's rule on a cell's smallest layer."""
    return m["images"] < MIN_IMAGES or m["values"] < MIN_VALUES


def thresholds(d: RunsData) -> tuple[str, str]:
    """(supported | not supported | not run yet, what the data support instead)."""
    ms = [m for c, m in measured(d) if m["state"] in ("breaks", "holds")]
    if len(measured(d)) < len(d.cells):
        return "not run yet", ""
    missed = [m for m in ms if m["state"] == "breaks" and not flagged(m)]
    over = [m for m in ms if m["state"] == "holds" and flagged(m)]
    broken = [m["values"] for m in ms if m["state"] == "breaks"]
    top = max(broken, default=0)
    held = [m["values"] for m in ms if m["state"] == "holds" and m["values"] > top]
    rng = (f"a values threshold above {top} and at most {min(held)}" if held else
           f"a values threshold above {top}")
    two_ok = any(m["images"] == 2 for m in ms if m["state"] == "holds")  # as the rule says
    instead = rng + ("; no samples threshold (a cell with 2 images per rank holds)"
                     if two_ok else "")
    if not missed and not over:
        return "supported", instead
    why = []
    if missed:
        why.append(f"{len(missed)} breaking cell(s) not flagged")
    if over:
        why.append(f"{len(over)} holding cell(s) flagged: "
                   + ", ".join(f"{m['images']} images, {m['values']} values" for m in over))
    return "not supported (" + "; ".join(why) + ")", instead


# ----------------------------------------------------------------------------------------
# The table, the figure, the verdict


def render(d: RunsData) -> str:
    rows = []
    for c in d.cells:
        m = measure(d, c)
        v = values(c)
        rows.append([c.cell.label, c.seeds_note(), fmt(v, 0) if v else "-",
                     str(c.cell.meta["per_rank"]), c.jstat("plateau_acc").fmt(1),
                     c.jstat("vn_sd").fmt(2), c.jstat("churn_floor").fmt(2),
                     "-" if m is None or m["state"] == "reference" else
                     f"{m['gap']:+.1f} ({fmt(m['lo'])} to {fmt(m['hi'])})",
                     "-" if m is None or m["state"] == "reference" else
                     f"{m['jitter']:.2f} ({fmt(m['jlo'], 2)} to {fmt(m['jhi'], 2)})",
                     "-" if m is None else m["state"]])
    answer, words = governs(d)
    doc, instead = thresholds(d)
    return table.runs_page(d, "\n".join([
        page.md_table(["cell", "seeds", "values per channel, smallest BN layer",
                        "images per rank", "plateau acc (%)", "von Neumann sd (pts)",
                        "churn floor (pts)", "gap to 1x8 (pts, 95% interval)",
                        "jitter / 1x8's (95% interval)", "state"], rows), "",
        f"**What governs the collapse: {answer}** ({words or 'no 2-image cell measured yet'}).",
        "",
        f"**The doctor's thresholds** (at risk below {MIN_IMAGES} images or {MIN_VALUES} values "
        f"per channel per rank): **{doc}**" + (f"; the data support {instead}." if instead
                                               else "."), "",
        f"Gap: the 1 x 8 reference's plateau accuracy minus the cell's, paired on the seed, mean "
        f"with a 95% t interval over seeds; breaks: gap >= {BREAK:g} points with the interval "
        f"above 0; holds: gap under {BREAK:g} points. Plateau: the second half of training. "
        "The rules are in bnlab/claims/values.py, written before these runs.", ""]))


def plot(d: RunsData, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for _, m in measured(d):
        if m["state"] == "reference" or m["values"] is None:
            continue
        kw = {"marker": MARKERS.get(m["images"], "o"), "ms": 7, "capsize": 3, "ls": "none",
              "color": f"C{[2, 4, 8].index(m['images']) if m['images'] in MARKERS else 3}"}
        label = f"{m['images']} images per rank"
        err = [[m["gap"] - m["lo"]], [m["hi"] - m["gap"]]] if m["lo"] is not None else None
        axes[0].errorbar([m["values"]], [m["gap"]], yerr=err, label=label, **kw)
        jerr = [[m["jitter"] - m["jlo"]], [m["jhi"] - m["jitter"]]] \
            if m["jlo"] is not None else None
        axes[1].errorbar([m["values"]], [m["jitter"]], yerr=jerr, label=label, **kw)
    if not any(m["state"] != "reference" for _, m in measured(d)):
        for ax in axes:
            nothing_yet(ax, "no cell and its 1 x 8 reference have 3 seeds yet")
    for ax, y, ylabel, title in (
            (axes[0], 0, "accuracy lost to 1 x 8 (points)", "accuracy gap to the reference"),
            (axes[1], 1, "jitter / 1 x 8's jitter", "jitter against the reference")):
        ax.axhline(y, color="grey", lw=1)
        ax.axvline(MIN_VALUES, color="C3", ls="--", lw=1,
                   label=f"doctor: at risk below {MIN_VALUES} values")
        ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel="values per channel at the smallest BN layer (log)",
               ylabel=ylabel)
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        keep = dict(zip(labels, handles, strict=True))  # one entry per marker
        if keep:
            ax.legend(keep.values(), keep.keys(), fontsize=8)
    save(fig, path, "Where BN breaks: global batch 8, only the grouping changes")


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # no claim of CLAIMS.md is this curve; its findings are stated in table.md


def finding(d: RunsData) -> str:
    """The table's answer in a line, for the README's first screen."""
    answer, words = governs(d)
    doc, _ = thresholds(d)
    if answer == "not run yet":
        return "Where BN breaks (values per channel): runs still to come"
    return (f"Where BN breaks: {answer}" + (f" ({words})" if words else "")
            + f"; the doctor's thresholds: {doc.split(' (')[0]}")


TABLE = table.Table("values", (), table.runs_data, render, verdicts, plot, block="settled",
                    headline="values.png", finding=finding)
