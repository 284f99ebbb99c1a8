"""`make table-values`: where BatchNorm breaks. Accuracy and jitter against the values each BN
channel normalizes over, with the number of samples separated from the number of values.

    python -m bnlab.claims values --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims values --report              # table from the runs' logs only

Trains experiments/values/sweep.yaml: one global batch of 8 images (and, by rule v5 below, a
block at 16), one learning rate (the pilot's, experiments/pilot), one data order (the seed's);
only how BN groups the images changes: 4 ranks x 2, 2 x 4, 1 x 8 (simulated; 1 x 8 with bn
computes exactly what syncbn at 4 x 2 does, so it is each input's reference), and 8 x 1 on the
64 px input. And the values per
image at the smallest BN map: torchvision resnet18 on 32 px images (1x1 in layer4), the same
model on images resized to 64 px (data.image_size=64: 2x2), and resnet20 (8x8). Each cell's
smallest layer normalizes over images per rank x map area values per channel (run.json's
bn_values_per_channel): 2, 4 (8 at the reference) at 32 px; 4, 8, 16 (32) at 64 px; 128, 256
(512) on resnet20. Two levels are reached from different numbers of images: 4 values from 4
images (32 px) and from 1 (64 px); 8 from 2 images (64 px) and from 8 (the 32 px reference,
which the rules below do not read: its gap is 0 by definition).
Every cell runs the settled headline protocol (configs/experiment/headline.yaml) shortened to
10 epochs for every cell (the budget: a 64 px cell was estimated, before the runs, at 4 times
a 32 px one), the plateau its second half, 3 seeds (5 where rule v4 adds them). Writes
experiments/values/{table.md, values.png}.

The rules, in their fourth version (experiments/README.md names the commits). The first three
came before any values run: the first judged a cell "holds" on its mean alone and read only
the 2-image cells, which a review found could call noise a hold and recommend a threshold that
flags holding cells; the third added the jitter's control check. The fourth (rule v4, last
below) came after runs were seen:

- A cell's *gap* is its reference's plateau accuracy minus its own, paired on the seed (the
  same initial weights and data order), with a 95% t interval over the seeds both finished
  without diverging. With fewer than MIN_SEEDS such pairs, or a reference that diverged on any
  seed, the cell is *unclear*. A cell that diverged on a seed where its reference did not
  *breaks*. Otherwise it *breaks* when the gap is >= BREAK points and its interval lies above
  0, *holds* when the gap is under BREAK points and its interval lies under HOLD_BOUND points
  (the seeds rule out a loss of that much), and is *unclear* otherwise. Its *jitter ratio* is
  the geometric mean over the same pairs of its plateau jitter (von Neumann sd) over its
  reference's, with a 95% t interval on the log ratios: *higher* where the interval lies above
  1, else *not higher* (no evidence of more jitter; with fewer than MIN_SEEDS pairs, as after
  a diverged seed in 3, *unclear*). The jitter is read only where its control is steady: the
  reference must learn and its plateau jitter be at most lr.STEADY times its own churn floor
  (table-lr's control check, lr.control_check: a reference with a diverged seed fails it);
  else the cell's jitter is *untestable*, before anything else is read.
  (Added with the rules' third version, before any values run: the second read the jitter
  whatever the reference's own, and table-lr's syncbn at this rate, 0.00625, was 2.4x its
  floor, not steady.)
- What governs the collapse, from every cell but the references (images and values per rank
  at the smallest BN layer, and whether it breaks): any cell unclear: "undecided"; no cell
  breaks: "BN does not break in this range"; every cell breaks: "BN breaks in every cell";
  else, where a values threshold separates the breaking cells from the holding ones (every
  breaking cell has fewer values than every holding one) and an images threshold does not:
  "values govern"; the reverse: "samples govern"; both do: "not separated by these cells";
  neither alone, but flagging below the holding cells' fewest images or fewest values flags
  every breaking cell: "both"; else "neither alone". The same reading of the jitter ratio
  (higher for breaks, not higher for holds) says what governs the jitter, over the cells whose
  reference is steady ("untestable" where there is none; the answer names the inputs left out).
- The doctor's thresholds (a BN layer is at risk below MIN_IMAGES images or MIN_VALUES values
  per channel per rank: doctor.at_risk, the rule the trainer's warning uses too): undecided
  while any cell is unclear; supported when every breaking cell is flagged and no holding
  cell is, else not supported. Where the separation above found a values or an images
  threshold, the table gives its range; for "both", the pair of thresholds. The doctor is then
  changed to it.
- Rule v4 (more seeds where three cannot decide; written after resnet20 2x4's first three
  seeds came out unclear, +1.8 points, 95% interval -1.4 to 5.0, and before any 64 px run had
  finished): a cell that is unclear on exactly MIN_SEEDS seed pairs because its interval is
  too wide (not a divergence, not a missing count) gets EXTRA_SEEDS more, and so does its
  input's 1 x 8 reference, once; it is then judged on all its pairs. The table and the README
  line say which cells got them, which cells the rule still asks to extend, and what the
  rules above give on every cell's first MIN_SEEDS seeds (first_seeds), which is the verdict
  this rule changes where it changes one.
- Rule v5, the global batch 16 block (written after every batch-8 run had been seen, before
  any of its own runs). Every batch-8 cell is flagged by the doctor, so none can tell whether
  its thresholds sit too high. On each input, 2 x 8 (8 images per rank) runs against 1 x 16
  (its reference, which BN at 16 images per rank computes), at the same rate, epochs and seeds
  (cells with `batch: 16` in the spec). Each 2 x 8 cell is judged by the rules above (gap,
  state, rule v4's extra seeds, jitter against its reference's control) against its input's
  1 x 16 (which is, for these cells, the reference rule v4 extends with them); these cells
  enter none of the batch-8 verdicts above (another global batch). The doctor flags resnet18
  32 px 2x8 (8 values per channel) and passes resnet18 64 px 2x8 (32) and resnet20 2x8 (512).
  Its thresholds at 8 images per rank: undecided while any of these
  cells is unclear or still to run; supported where every cell it flags breaks and every cell
  it passes holds; else not supported, naming each cell it gets wrong. The words say on which
  inputs 8 images per rank held and on which BN broke.

Added after every batch-8 run was in, as a reading that changes no verdict (count_rules): where
no pair of thresholds separates the cells ("neither alone"), the table says how few holding cells
a rule "at risk below i images or below v values" must flag to flag every breaking cell, which
cells force it, whether the doctor's rule does that well, whether these cells test its values
threshold at all, and how many cells below its images threshold broke (the README line too).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from bnlab.claims import lr as lrtable
from bnlab.doctor import MIN_IMAGES, MIN_VALUES, at_risk
from bnlab.lab import devices, page, table
from bnlab.lab.analysis import mean_interval
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import RunsData, Verdict
from bnlab.paths import RUNS_CUDA

BREAK = 2.0        # points of accuracy lost to the reference at which a cell breaks
HOLD_BOUND = 4.0   # a cell holds only where its interval rules out losing this many points
MIN_SEEDS = 3
EXTRA_SEEDS = (3, 4)  # rule v4: an unclear cell's, and its reference's, seeds beyond the first
MARKERS = {1: "v", 2: "o", 4: "s", 8: "^"}  # by images per rank, at global batch 8
BIG = 16  # rule v5's global batch: 2 x BIG // 2 against 1 x BIG
BIG_STYLE = {"marker": "D", "color": "C4"}  # its cells (the references: hollow, grey)


def groups(d: RunsData) -> dict[str, list[CellResult]]:
    """Cells by input (model and image size)."""
    out: dict[str, list[CellResult]] = {}
    for c in d.cells:
        out.setdefault(c.cell.meta["input"], []).append(c)
    return out


def batch(c: CellResult) -> int:
    """The cell's global batch: 8, or 16 in rule v5's block."""
    return c.cell.meta.get("batch", 8)


def reference(d: RunsData, c: CellResult) -> CellResult:
    """The cell's input's 1 x batch cell (tests/claims/test_pilot.py checks the spec has one)."""
    return next(r for r in groups(d)[c.cell.meta["input"]]
                if batch(r) == batch(c) and r.cell.meta["per_rank"] == batch(c))


def values(c: CellResult) -> int | None:
    """Values per channel at the cell's smallest BN layer, from its runs' run.json."""
    for r in c.runs:
        counts = r.info.get("bn_values_per_channel")
        if counts:
            return min(counts.values())
    return None


def finished(c: CellResult) -> bool:
    """Every seed the spec asks for has ended (completed or diverged), and it asks for some."""
    return c.expected > 0 and table.complete(c)


def pairs(c: CellResult, ref: CellResult) -> tuple[list[float], list[float], list[int]]:
    """(gaps, log jitter ratios, seeds where only the cell diverged), over the seeds both ran."""
    mine, theirs = {r.seed: r for r in c.runs}, {r.seed: r for r in ref.runs}
    gaps, logs, lost = [], [], []
    for s in sorted(set(mine) & set(theirs)):
        a, b = mine[s], theirs[s]
        if a.diverged and not b.diverged:
            lost.append(s)
        if a.diverged or b.diverged:
            continue
        ja, jb = a.jitter(c.epochs), b.jitter(ref.epochs)
        if ja.get("plateau_acc") is not None and jb.get("plateau_acc") is not None:
            gaps.append(jb["plateau_acc"] - ja["plateau_acc"])
        if (ja.get("vn_sd") or 0) > 0 and (jb.get("vn_sd") or 0) > 0:
            logs.append(math.log(ja["vn_sd"] / jb["vn_sd"]))
    return gaps, logs, lost


def state(gap: float, lo: float | None, hi: float | None, n: int) -> str:
    """breaks, holds or unclear, by the rule, from the paired gaps' mean and interval."""
    if n < MIN_SEEDS or lo is None or hi is None:
        return "unclear"
    if gap >= BREAK and lo > 0:
        return "breaks"
    if gap < BREAK and hi < HOLD_BOUND:
        return "holds"
    return "unclear"


def control(ref: CellResult) -> lrtable.Control:
    """table-lr's control check on an input's 1 x batch reference: does its jitter stand
    still?"""
    return lrtable.control_check(ref, ref.cell.cfg.get("optim", {}).get("lr", math.nan),
                                 f"{ref.cell.meta['input']}'s 1 x {batch(ref)} reference")


def shared(ref: CellResult, c: CellResult) -> CellResult:
    """The reference over the cell's own seeds: seeds rule v4 gives the reference for another
    cell change nothing of this one (its pairs, its reference's divergence or control)."""
    if ref is c:
        return ref
    seeds = set(c.cell.seeds)
    return replace(ref, runs=[r for r in ref.runs if r.seed in seeds],
                   expected=len(seeds & set(ref.cell.seeds)))


def measure(d: RunsData, c: CellResult) -> dict | None:
    """The cell against its reference over the seeds the cell has: gap and jitter ratio (with
    intervals), state; None until both have ended every one of those seeds."""
    ref = shared(reference(d, c), c)
    if not (finished(c) and finished(ref)):
        return None
    base = {"label": c.cell.label, "batch": batch(c), "values": values(c),
            "images": c.cell.meta["per_rank"], "input": c.cell.meta["input"],
            "acc": c.jstat("plateau_acc"), "vn": c.jstat("vn_sd")}
    if c is ref:
        return {**base, "gap": 0.0, "lo": None, "hi": None, "jitter": 1.0, "jlo": None,
                "jhi": None, "n": len(c.runs), "state": "reference", "jstate": "reference",
                "why": "diverged" if ref.diverged else ""}
    gaps, logs, lost = pairs(c, ref)
    lo, hi = mean_interval(gaps)
    gap = float(np.mean(gaps)) if gaps else math.nan
    llo, lhi = mean_interval(logs)
    jitter = math.exp(float(np.mean(logs))) if logs else math.nan
    jlo, jhi = (math.exp(llo), math.exp(lhi)) if llo is not None else (None, None)
    if ref.diverged:
        st, why = "unclear", "its reference diverged"
    elif lost:
        st, why = "breaks", f"diverged on seed {', '.join(map(str, lost))}"
    elif base["values"] is None:
        st, why = "unclear", "no bn_values_per_channel in its run.json"
    else:
        st = state(gap, lo, hi, len(gaps))
        why = f"{len(gaps)} seed pairs" if len(gaps) < MIN_SEEDS else ""
    return {**base, "gap": gap, "lo": lo, "hi": hi, "jitter": jitter, "jlo": jlo, "jhi": jhi,
            "n": len(gaps), "state": st, "why": why,
            "jstate": "untestable" if not control(ref).ok else
            "unclear" if len(logs) < MIN_SEEDS or base["values"] is None else
            "higher" if jlo > 1 else "not higher"}


def measured(d: RunsData) -> list[tuple[CellResult, dict]]:
    """Every cell measured so far: where rule v4's seeds are still to come, on its first
    seeds, marked pending (shown in the table, the figure and the words; read by no rule)."""
    first = None
    out = []
    for c in d.cells:
        m = measure(d, c)
        if m is None and len(c.cell.seeds) > MIN_SEEDS:
            first = first or first_seeds(d)
            m = measure(first, next(x for x in first.cells if x.cell.label == c.cell.label))
            if m is not None:
                to_come = ", ".join(map(str, sorted(c.cell.seeds)[MIN_SEEDS:]))
                m = {**m, "pending": True, "why": f"on its first {MIN_SEEDS} seeds; seeds "
                     f"{to_come} to come" + (f"; {m['why']}" if m["why"] else "")}
        if m is not None:
            out.append((c, m))
    return out


def block_so_far(d: RunsData, size: int = 8) -> list[dict]:
    """The cells of one global batch but the references, as far as they are measured."""
    return [m for _, m in measured(d) if m["batch"] == size and m["state"] != "reference"]


def read(d: RunsData, size: int = 8) -> list[dict] | None:
    """Every cell of one global batch but the references, measured; None while any is still to
    come."""
    out = [m for c in d.cells if batch(c) == size and c is not reference(d, c)
           for m in [measure(d, c)]]
    return None if not out or any(m is None for m in out) else out


JITTER_WORDS = {"BN does not break in this range": "no cell's jitter is higher",
                "BN breaks in every cell": "every cell's jitter is higher"}


def separation(points: list[tuple[int, int | None, str]]) -> tuple[str, str]:
    """(what governs, the thresholds that separate) from (images, values, state) points,
    state breaks, holds or unclear, by the rule."""
    if not points or any(s == "unclear" or v is None for _, v, s in points):
        return "undecided", ""
    bad = [(i, v) for i, v, s in points if s == "breaks"]
    ok = [(i, v) for i, v, s in points if s != "breaks"]
    if not bad:
        least = min(i for i, _ in ok)
        return "BN does not break in this range", (
            f"nothing to flag from {images(least)} and "
            f"{min(v for _, v in ok)} values per channel up")
    if not ok:
        return "BN breaks in every cell", ""
    top_i, top_v = max(i for i, _ in bad), max(v for _, v in bad)
    low_i, low_v = min(i for i, _ in ok), min(v for _, v in ok)
    by_v, by_i = top_v < low_v, top_i < low_i
    v_range = f"a values threshold above {top_v} and at most {low_v}"
    i_range = f"an images threshold above {top_i} and at most {low_i}"
    if by_v and not by_i:
        return "values govern", v_range + "; no images threshold"
    if by_i and not by_v:
        return "samples govern", i_range + "; no values threshold"
    if by_v and by_i:
        return "not separated by these cells", f"{v_range}, or {i_range}"
    if all(i < low_i or v < low_v for i, v in bad):
        return "both", f"at risk below {low_i} images or below {low_v} values"
    return "neither alone", ""


def said(m: dict, key: str = "state") -> str:
    """One cell's state and the number it was read from: 'breaks (-27.0 pts vs 1x8)' (the
    jitter: its ratio), why where a divergence decided it, and whether seeds are to come."""
    x = m["gap"] if key == "state" else m["jitter"]
    number = "" if x is None or not math.isfinite(x) else (
        f"{-round(x, 1) + 0.0:+.1f} pts vs 1x{m['batch']}" if key == "state"
        else f"{x:.2f}x")
    if key == "state" and "diverged" in m["why"]:  # the divergence decided it
        why = m["why"].split("; ")[-1]
        number = f"{why}; {number} on the other seeds" if number else why
    return (f"{m[key]}" + (f" ({number})" if number else "")
            + (f" on {MIN_SEEDS} seeds, more to come" if m.get("pending") else ""))


def words(ms: list[dict], key: str = "state") -> str:
    """The cells in a few words, by values, with the number each state was read from:
    '2 values from 2 images: breaks (-27.0 pts vs 1x8), ...' (jitter: the ratio)."""
    return ", ".join(f"{where(m)}: {said(m, key)}"
                     for m in sorted(ms, key=lambda m: (m["values"] or 0, m["images"])))


def images(n: int) -> str:
    """'1 image', '4 images'."""
    return f"{n} image{'s' * (n != 1)}"


def where(m: dict) -> str:
    """'4 values from 1 image'."""
    return f"{m['values']} values from {images(m['images'])}"


def governs(d: RunsData, key: str = "state") -> tuple[str, str]:
    """(answer, the cells in words) by the rule; key "jstate" for the jitter."""
    ms = read(d)
    if ms is None:
        return "not run yet", words(block_so_far(d), key)
    if key != "jstate":
        return separation(points(ms, key))[0], words(ms, key)
    left_out = sorted({m["input"] for m in ms if m["jstate"] == "untestable"})
    ms_read = [m for m in ms if m["jstate"] != "untestable"]
    if not ms_read:
        return "untestable (no input's 1 x 8 reference is steady)", words(ms, key)
    answer = separation([(m["images"], m["values"], "breaks" if m[key] == "higher" else
                          "unclear" if m[key] == "unclear" else "holds") for m in ms_read])[0]
    answer = JITTER_WORDS.get(answer, answer)
    if left_out:
        answer += f" (reference not steady, left out: {', '.join(left_out)})"
    return answer, words(ms, key)


def flagged(m: dict) -> bool:
    """The doctor's rule on a cell's smallest layer."""
    return at_risk(m["images"], m["values"])


def misjudged(ms: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the breaking cells the doctor's rule misses, the holding cells it flags)."""
    return ([m for m in ms if m["state"] == "breaks" and not flagged(m)],
            [m for m in ms if m["state"] == "holds" and flagged(m)])


def thresholds(d: RunsData) -> tuple[str, str]:
    """(supported | not supported (why) | undecided | not run yet, what the data support)."""
    ms = read(d)
    if ms is None:
        return "not run yet", ""
    answer, instead = separation(points(ms))
    if answer == "undecided":
        return "undecided (a cell is unclear or lacks its values per channel)", ""
    missed, over = misjudged(ms)
    if not missed and not over:
        return "supported", instead
    why = []
    if missed:
        why.append(f"{len(missed)} breaking cell(s) not flagged: "
                   + "; ".join(where(m) for m in missed))
    if over:
        why.append(f"{len(over)} holding cell(s) flagged: "
                   + "; ".join(where(m) for m in over))
    return "not supported (" + "; ".join(why) + ")", instead


def points(ms: list[dict], key: str = "state") -> list[tuple[int, int | None, str]]:
    """The cells as separation reads them: (images, values, state)."""
    return [(m["images"], m["values"], m[key]) for m in ms]


def neither(ms: list[dict] | None) -> bool:
    """Every cell measured, and no pair of thresholds separates them."""
    return ms is not None and separation(points(ms))[0] == "neither alone"


def fewest_flagged(ms: list[dict]) -> int:
    """Over every rule 'at risk below i images or below v values' (i and v one past a level the
    cells have, or 0: no threshold) that flags every breaking cell, the fewest holding cells
    it flags."""
    def cuts(levels: set[int]) -> list[int]:
        return [0] + sorted(x + 1 for x in levels)
    bad = [m for m in ms if m["state"] == "breaks"]
    ok = [m for m in ms if m["state"] == "holds"]
    return min(sum(at_risk(m["images"], m["values"], min_values=v, min_images=i) for m in ok)
               for i in cuts({m["images"] for m in ms}) for v in cuts({m["values"] for m in ms})
               if all(at_risk(m["images"], m["values"], min_values=v, min_images=i)
                      for m in bad))


def cells(k: int, n: int, kind: str = "") -> str:
    """k of n cells in words: 'the one cell', 'both holding cells', 'all 7 cells', 'no cell',
    'none of the 3 cells', '2 of the 7 cells'."""
    noun = f"{kind} cell".strip()
    if k == n:
        return f"the one {noun}" if n == 1 else f"both {noun}s" if n == 2 else f"all {n} {noun}s"
    if k == 0:
        return f"no {noun}" if n == 1 else f"none of the {n} {noun}s"
    return f"{k} of the {n} {noun}s"


def few_images(ms: list[dict]) -> str:
    """'below 8 images per rank, BN broke in 6 of the 7 cells, at 2 to 256 values per
    channel' (the doctor's images threshold; "" where no cell is below it)."""
    below = [m for m in ms if m["images"] < MIN_IMAGES]
    broke = sorted(m["values"] for m in below if m["state"] == "breaks")
    if not below:
        return ""
    at = "" if not broke else f", at {broke[0]} values per channel" if broke[0] == broke[-1] \
        else f", at {broke[0]} to {broke[-1]} values per channel"
    return f"below {images(MIN_IMAGES)} per rank, BN broke in {cells(len(broke), len(below))}{at}"


def count_rules(d: RunsData) -> str:
    """Where no pair of thresholds separates the cells ("neither alone"): how few holding cells
    a rule 'at risk below i images or below v values' must flag to flag every breaking cell,
    the cells that force it where single cells do (a breaking cell with no fewer images and no
    fewer values than a holding one), how the doctor's rule compares and whether these cells
    can place its thresholds at all. A reading added after every run was in, changing no
    verdict; "" elsewhere."""
    ms = read(d)
    if not neither(ms):
        return ""
    ok = [m for m in ms if m["state"] == "holds"]
    least = fewest_flagged(ms)
    forced = list(dict.fromkeys(
        (b["label"], f"the cell with {where(b)} breaks and the one with {where(h)} holds")
        for h in ok for b in ms if b["state"] == "breaks"
        and b["images"] >= h["images"] and b["values"] >= h["values"]))
    then = on_first_seeds(first_seeds(d))
    now = {m["label"]: m for m in ms}
    later = [f"{k} breaks on {now[k]['n']} seed pairs, under rule v4; on its first "
             f"{MIN_SEEDS} it was {then[k]['state']}" for k, _ in forced
             if k in then and then[k]["state"] != "breaks"]
    why = ("" if not forced else f": {'; '.join(w for _, w in forced)} (each breaking cell "
           "named has no fewer images and no fewer values than the holding one beside it"
           + "".join(f"; {x}" for x in later) + ")")
    missed, over = map(len, misjudged(ms))
    if all(flagged(m) for m in ms):
        mine = (f"flags every judged cell, each under {images(MIN_IMAGES)} per rank or under "
                f"{MIN_VALUES} values per channel, so it flags {cells(over, len(ok), 'holding')}"
                + (", as any such rule must" if over == least else "")
                + "; no judged cell lies outside it, so these runs cannot tell whether lower "
                "thresholds would do")
    elif (missed, over) == (0, least):
        mine = "misses no breaking cell and flags no more holding cells than any such rule must"
    else:
        mine = (f"misses {cells(missed, len(ms) - len(ok), 'breaking')} "
                f"and flags {cells(over, len(ok), 'holding')}")
    few = few_images(ms)
    return (f"every rule 'at risk below i images or below v values' that flags every breaking "
            f"cell flags {cells(least, len(ok), 'holding')}{why}. The doctor's rule {mine}"
            + (f". {few[0].upper()}{few[1:]}" if few else ""))


def rule_v5(d: RunsData) -> tuple[str, str]:
    """Rule v5 on the global batch BIG block: (the doctor's thresholds at BIG // 2 images per
    rank: supported | not supported (the cells it gets wrong) | undecided (why), the cells in
    words with whether the doctor flags each); ("", "") without the block."""
    if not any(batch(c) == BIG for c in d.cells):
        return "", ""
    ms = read(d, BIG)
    cells_said = "; ".join(f"{m['input']}, {where(m)}: {said(m)}, " + (
        "values per channel unknown" if m["values"] is None else
        "flagged by the doctor" if flagged(m) else "passed by the doctor")
        for m in sorted(ms if ms is not None else block_so_far(d, BIG),
                        key=lambda m: m["values"] or 0))
    if ms is None:
        return "undecided (runs still to come)", cells_said
    if open_ := [m["label"] for m in ms if m["state"] == "unclear" or m["values"] is None]:
        return (f"undecided ({' and '.join(open_)} unclear or without values per channel)",
                cells_said)
    wrong = [m for m in ms if flagged(m) != (m["state"] == "breaks")]
    if not wrong:
        return "supported", cells_said
    return "not supported (" + "; ".join(
        f"{m['input']}, {where(m)}: {'flagged, holds' if flagged(m) else 'passed, breaks'}"
        for m in wrong) + ")", cells_said


def on_first_seeds(first: RunsData) -> dict[str, dict]:
    """Each cell measured on its first seeds (first_seeds(d)), by label."""
    return {c.cell.label: m for c, m in measured(first)}


def first_seeds(d: RunsData) -> RunsData:
    """Every cell cut to its first MIN_SEEDS seeds: the data as the rules before v4 read it."""
    cut = []
    for c in d.cells:
        keep = sorted(c.cell.seeds)[:MIN_SEEDS]
        cut.append(replace(c, cell=replace(c.cell, seeds=keep),
                           runs=[r for r in c.runs if r.seed in keep],
                           expected=min(c.expected, len(keep))))
    return replace(d, cells=cut)


def to_extend(d: RunsData, first: RunsData | None = None) -> list[CellResult]:
    """The cells rule v4 gives more seeds, with their references, from their first seeds
    (`first`: first_seeds(d), where the caller has it): unclear on exactly MIN_SEEDS pairs
    because the interval is too wide."""
    first = first or first_seeds(d)
    asked = {}
    for c in first.cells:
        m = measure(first, c)
        if m is not None and m["state"] == "unclear" and not m["why"] and m["n"] == MIN_SEEDS:
            for x in (c, reference(first, c)):
                asked[x.cell.label] = x
    return [c for c in d.cells if c.cell.label in asked]


def extension(d: RunsData) -> tuple[str, str]:
    """(a sentence, a few words) on rule v4: the cells given more seeds, any the rule asks for
    that the spec lacks, any the spec extends otherwise than the rule says, the cells whose
    state the extra seeds changed, and what the rules give on every cell's first seeds;
    ("", "") where no cell needs or has more."""
    have = [c for c in d.cells if len(c.cell.seeds) > MIN_SEEDS]
    first = first_seeds(d)
    asked = to_extend(d, first)
    if not have and not asked:
        return "", ""
    labels = {c.cell.label for c in asked}
    rule = (f"rule v4, written after resnet20 2x4's first {MIN_SEEDS} seeds came out unclear, "
            "before any 64 px run had finished")
    parts, few = [], []
    if have:
        names = ", ".join(c.cell.label for c in have)
        parts.append(f"{names}: seeds beyond the first {MIN_SEEDS} ({rule})")
        few.append(f"more seeds for {names} (rule v4, after runs were seen)")
    if lack := [c.cell.label for c in asked if len(c.cell.seeds) <= MIN_SEEDS]:
        parts.append(f"rule v4 asks for seeds {', '.join(map(str, EXTRA_SEEDS))} of "
                     f"{', '.join(lack)} (unclear on {MIN_SEEDS} seeds): add them to "
                     "experiments/values/sweep.yaml")
        few.append(f"rule v4 asks for more seeds of {', '.join(lack)}")
    right = [*range(MIN_SEEDS), *EXTRA_SEEDS]
    if outside := [c.cell.label for c in have
                   if c.cell.label not in labels or sorted(c.cell.seeds) != right]:
        parts.append(f"{', '.join(outside)} extended otherwise than rule v4 says (seeds "
                     f"{', '.join(map(str, right))} for a cell unclear on {MIN_SEEDS} and its "
                     "reference)")
        few.append(f"{', '.join(outside)} extended outside rule v4")
    then = on_first_seeds(first)
    now = {c.cell.label: m for c, m in measured(d) if not m.get("pending")}
    if changed := [f"{k}: {then[k]['state']} on {MIN_SEEDS} seeds, {m['state']} on {m['n']}"
                   for k, m in now.items() if k in then and m["state"] != then[k]["state"]]:
        parts.append("changed by the extra seeds: " + ", ".join(changed))
    answer, doc = governs(first)[0], thresholds(first)[0].split(" (")[0]
    jitter = governs(first, "jstate")[0]
    v5 = rule_v5(first)[0].split(" (")[0] if read(first, BIG) is not None else ""
    at_v5 = f", the doctor's thresholds at {images(BIG // 2)} per rank {v5}" if v5 else ""
    parts.append(f"on every cell's first {MIN_SEEDS} seeds the rules give: the collapse "
                 f"{answer}, the jitter {jitter}, the doctor's thresholds {doc}{at_v5}")
    if answer != "not run yet":
        few.append(f"on {MIN_SEEDS} seeds: {answer}" + at_v5)
    return "; ".join(parts) + ".", "; ".join(few)


# ----------------------------------------------------------------------------------------
# The table, the figure, the verdict


def render(d: RunsData) -> str:
    rows = []
    so_far = {c.cell.label: m for c, m in measured(d)}
    for c in d.cells:
        m = so_far.get(c.cell.label)
        v = values(c)
        theirs = m is None or m["state"] == "reference"
        rows.append([c.cell.label, c.seeds_note(), fmt(v, 0) if v else "-",
                     str(c.cell.meta["per_rank"]), c.jstat("plateau_acc").fmt(1),
                     c.jstat("vn_sd").fmt(2), c.jstat("churn_floor").fmt(2),
                     "-" if theirs or not math.isfinite(m["gap"]) else
                     f"{m['gap']:+.1f} ({fmt(m['lo'])} to {fmt(m['hi'])})",
                     "-" if theirs else
                     f"{fmt(m['jitter'], 2)} ({fmt(m['jlo'], 2)} to {fmt(m['jhi'], 2)}): "
                     f"{m['jstate']}",
                     "-" if m is None else m["state"] + (f" ({m['why']})" if m["why"] else "")])
    answer, cells = governs(d)
    janswer, _ = governs(d, "jstate")
    refs = [c for c in d.cells if c is reference(d, c) and finished(c)]
    doc, instead = thresholds(d)
    v5, v5_cells = rule_v5(d)
    return table.runs_page(d, "\n".join([
        page.md_table(["cell", "seeds", "values per channel, smallest BN layer",
                        "images per rank", "plateau acc (%)", "von Neumann sd (pts)",
                        "churn floor (pts)", "gap to 1 x batch (pts, 95% interval)",
                        "jitter / 1 x batch's (95% interval)", "state"], rows), "",
        f"**What governs the collapse: {answer}** ({cells or 'no cell measured yet'}).", "",
        *([f"More seeds: {ext}", ""] if (ext := extension(d)[0]) else []),
        f"**What governs the jitter: {janswer}** (a cell counts where its jitter ratio's "
        "interval lies above 1, and only where its reference is steady).", "",
        "Controls (the jitter's): " + ("; ".join(
            control(r).why for r in refs) if refs else "none measured yet")
        + (f" (the 1 x {BIG} references control their own cells' jitter only)."
           if any(batch(r) == BIG for r in refs) else "."), "",
        f"**The doctor's thresholds** (at risk below {MIN_IMAGES} images or {MIN_VALUES} values "
        f"per channel per rank): **{doc}**" + (f"; the data support {instead}." if instead
                                               else "."), "",
        *([f"What a count rule can do here (a reading added after every batch-8 run was in; "
           f"it changes no verdict above): {rules}.", ""] if (rules := count_rules(d)) else []),
        *([f"**The doctor's thresholds at {images(BIG // 2)} per rank** (global batch {BIG}: "
           f"2 x {BIG // 2} against 1 x {BIG}, rule v5): **{v5}** "
           f"({v5_cells or 'no cell measured yet'}).", ""] if v5 else []),
        *([f"**On CUDA** (the same cells, the same rules; `make gpu-check`): {x}", ""]
          if (x := on_cuda(d)) else []),
        f"Gap: the 1 x batch reference's plateau accuracy (1 x 8, or 1 x 16 for the global "
        f"batch 16 cells) minus the cell's, paired on the seed, mean "
        f"with a 95% t interval over seeds; breaks: gap >= {BREAK:g} points with the interval "
        f"above 0; holds: gap under {BREAK:g} points with the interval under {HOLD_BOUND:g}; "
        f"else unclear (and with fewer than {MIN_SEEDS} seed pairs); a cell that diverged on a "
        "seed where its reference did not breaks, and every cell of a reference that diverged "
        "is unclear. Jitter ratio: geometric mean over the seed pairs, 95% t interval on the log "
        "ratios. Plateau: the second half of training. " + "".join(
            f"The {r.cell.meta['input']} 1 x {batch(r)} reference normalizes {values(r)} values "
            "per channel "
            f"over {r.cell.meta['per_rank']} images, itself at risk by the doctor's thresholds: "
            f"gaps there are to syncbn over the same {r.cell.meta['per_rank']} images, not to an "
            "unbroken BN. " for r in refs
            if values(r) and at_risk(r.cell.meta["per_rank"], values(r)))
        + "The rules are in bnlab/claims/values.py, written before these runs but for rule v4 "
        f"(more seeds where {MIN_SEEDS} leave a cell unclear), written after some were seen, "
        "and rule v5 (the global batch 16 block), written after every batch-8 run was seen and "
        "before any of its own.",
        ""]))


def on_cuda(d: RunsData) -> str | None:
    """The cells' states from the GPU's runs (experiments/runs-cuda beside these), each beside
    this folder's; None where no GPU run is there."""
    there = devices.elsewhere(d, d.root.with_name(RUNS_CUDA.name))
    if there is None:
        return None
    return devices.compare(d, there, measure, lambda c: c.cell.meta["input"] + (
        f", global batch {batch(c)}" if batch(c) != 8 else ""))


def lost_seed(m: dict) -> bool:
    """A cell that breaks because it diverged on a seed where its reference did not."""
    return m["state"] == "breaks" and "diverged on seed" in m["why"]


def style(m: dict) -> dict:
    """A cell's marker: its shape and colour by images per rank, rule v5's block its own; the
    references grey, hollow, in their block's shape (1 x 8 as 8 images per rank)."""
    n, ref = m["images"], m["state"] == "reference"
    if m["batch"] == BIG:
        kw = dict(BIG_STYLE)
    else:
        kw = {"marker": MARKERS.get(n, "o"),
              "color": f"C{sorted(MARKERS).index(n)}" if n in MARKERS else "C5"}
    return {**kw, "ms": 7, "ls": "none", **({"mfc": "none", "color": "0.5"} if ref else {})}


def shift(m: dict) -> float:
    """A cell's x: its values per channel, stepped by images per rank where two layouts reach
    one level (rule v5's block one step further)."""
    n = m["images"]
    step = 2.5 if m["batch"] == BIG else sorted(MARKERS).index(n) - 1.5 if n in MARKERS else 0
    return m["values"] * 2 ** (0.18 * step)


def legend(ms: list[dict], gap: bool) -> tuple[list, list[str]]:
    """One entry per images per rank that a cell has, then the references and the markings
    that the panel (`gap`, else the jitter's) draws (a point left unread keeps its shape,
    greyed)."""
    from matplotlib.lines import Line2D
    handles, labels = [], []
    for size, n in sorted({(m["batch"], m["images"]) for m in ms if m["state"] != "reference"}):
        handles.append(Line2D([], [], **style({"images": n, "batch": size, "state": ""})))
        labels.append(f"{images(n)} per rank" + (f" (global batch {size})" if size != 8 else ""))
    for size in sorted({m["batch"] for m in ms if m["state"] == "reference"}):
        handles.append(Line2D([], [], **style({"images": size, "batch": size,
                                               "state": "reference"})))
        labels.append(f"1 x {size} reference " + ("(gap 0)" if gap else "(ratio 1)"))
    if any(m.get("pending") for m in ms):
        handles.append(Line2D([], [], marker="o", ms=7, ls="none", color="0.3", alpha=0.35))
        labels.append(f"faded: on {MIN_SEEDS} seeds, rule v4's seeds to come")
    if gap and any(lost_seed(m) for m in ms):
        handles.append(Line2D([], [], marker="x", ms=9, ls="none", color="C3"))
        labels.append("diverged on a seed: breaks (gap over the other seeds)")
    if not gap and any(m["jstate"] == "untestable" for m in ms):
        handles.append(Line2D([], [], marker="o", ms=7, ls="none", color="0.7", mfc="none"))
        labels.append("grey, hollow: reference not steady, not read")
    return handles, labels


def plot(d: RunsData, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    ms = [m for _, m in measured(d) if m["values"] is not None]
    lost = []  # cells that diverged on every seed they ran: no gap to draw
    for m in ms:
        kw, x = style(m), shift(m)
        diverged = lost_seed(m)
        if diverged and not math.isfinite(m["gap"]):
            lost.append((x, kw))
        for ax, y, lo, hi in ((axes[0], m["gap"], m["lo"], m["hi"]),
                              (axes[1], m["jitter"], m["jlo"], m["jhi"])):
            if y is None or not math.isfinite(y):
                continue
            err = [[y - lo], [hi - y]] if lo is not None and hi is not None else None
            unread = ax is axes[1] and m["jstate"] == "untestable"  # drawn, not read
            ax.errorbar([x], [y], yerr=err, capsize=3, alpha=0.35 if m.get("pending") else 1,
                        **({**kw, "color": "0.7", "mfc": "none"} if unread else kw))
            if diverged and ax is axes[0]:
                ax.plot([x], [y], marker="x", ms=9, ls="none", color="C3")
    for x, kw in lost:  # at the top of the gap panel, where the worst cells are
        axes[0].plot([x], [0.96], transform=axes[0].get_xaxis_transform(),
                     **{**kw, "marker": "x", "ms": 9, "color": "C3"})
    if not any(m["state"] != "reference" for m in ms):
        for ax in axes:
            nothing_yet(ax, "no cell and its reference have all their seeds yet")
    for ax, y, ylabel, title, line in (
            (axes[0], 0, "accuracy lost to the 1 x batch reference (points)",
             "accuracy gap to the reference",
             (BREAK, f"breaks at {BREAK:g} points lost (interval above 0)")),
            (axes[1], 1, "jitter / the reference's jitter", "jitter against the reference",
             None)):
        ax.axhline(y, color="grey", lw=1)
        if line:
            ax.axhline(line[0], color="C3", ls=":", lw=1, label=line[1])
        ax.axvline(MIN_VALUES, color="C3", ls="--", lw=1,
                   label=f"doctor: at risk below {MIN_VALUES} values (or {MIN_IMAGES} images)")
        ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel="values per channel at the smallest BN layer (log)",
               ylabel=ylabel)
        ax.grid(alpha=0.3)
        lines, names = ax.get_legend_handles_labels()  # the thresholds first, then the cells
        handles, labels = legend(ms, ax is axes[0])
        ax.legend(lines + handles, names + labels, fontsize=8)
    save(fig, path, "Where BN breaks: global batch 8 (and 16: 2 x 8 against 1 x 16), only the "
                    "grouping changes")


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # no claim under test is this curve; its findings are stated in table.md


def finding(d: RunsData) -> str:
    """The table's answer in a line, for the README's first screen (the cells so far while
    runs are still to come)."""
    ms = read(d)
    _, few = extension(d)
    note = f" [{few}]" if few else ""
    if ms is None:
        _, so_far = governs(d)
        return ("Where BN breaks (values per channel): runs still to come" +
                (f"; so far {so_far}" if so_far else "") + note)
    answer, instead = separation(points(ms))
    doc, _ = thresholds(d)
    after = ""
    if neither(ms):  # count_rules' reading, in a few words
        few_below = few_images(ms)
        after = ("; read after the batch-8 runs: " + few_below + ("; " if few_below else "")
                 + "no rule 'below i images or below v values' separates the cells"
                 + (", and the doctor's rule flags every one" if all(map(flagged, ms)) else ""))
    return (f"Where BN breaks: {answer}" + (f" ({instead})" if instead else "")
            + f"; the doctor's thresholds: {doc.split(' (')[0]}{note}{after}{v5_line(d)}")


def v5_line(d: RunsData) -> str:
    """Rule v5's block for the README line: '; at 8 images per rank (global batch 16, rule
    v5): BN broke on resnet18 32 px, held on resnet20; the doctor's thresholds there:
    supported' ("" without the block)."""
    v5 = rule_v5(d)[0]
    if not v5:
        return ""
    head = f"; at {images(BIG // 2)} per rank (global batch {BIG}, rule v5): "
    ms = read(d, BIG)
    if ms is None:
        broke = [m["input"] for m in block_so_far(d, BIG)
                 if m["state"] == "breaks" and not m.get("pending")]
        return head + "runs still to come" + (f"; so far BN broke on {' and '.join(broke)}"
                                              if broke else "")
    by = {st: " and ".join(m["input"] for m in ms if m["state"] == st)
          for st in ("breaks", "holds", "unclear")}
    return (head + ", ".join(f"{verb} on {by[st]}" for st, verb in
                             (("breaks", "BN broke"), ("holds", "held"), ("unclear", "unclear"))
                             if by[st])
            + f"; the doctor's thresholds there: {v5}")


TABLE = table.Table("values", (), table.runs_data, render, verdicts, plot, block="settled",
                    headline="values.png", finding=finding)
