"""table-values: the doctor's thresholds against the cells (bnlab/doctor.py at_risk), rule v4's
extra seeds and rule v5's global batch 16 block, by experiments/values/rules.yaml."""

from __future__ import annotations

from bnlab.claims.values.cells import (
    BIG,
    EXTRA_SEEDS,
    MIN_SEEDS,
    batch,
    block_so_far,
    first_seeds,
    governs,
    images,
    measured,
    on_first_seeds,
    points,
    read,
    said,
    separation,
    to_extend,
    where,
)
from bnlab.doctor import MIN_IMAGES, MIN_VALUES, at_risk
from bnlab.lab.table import RunsData


def flagged(m: dict) -> bool:
    """The doctor's rule on a cell's smallest layer, at this module's thresholds (bnlab's,
    read at each call, as few_images and count_rules read them)."""
    return at_risk(m["images"], m["values"], min_values=MIN_VALUES, min_images=MIN_IMAGES)


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
    """'below 4 images per rank, BN broke in all 4 cells, at 2 to 128 values per channel'
    (the doctor's images threshold; "" where no cell is below it)."""
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



def extension(d: RunsData) -> tuple[str, str]:
    """(a sentence, a few words) on rule v4: the cells given more seeds, any the rule asks for
    that the spec lacks, any the spec extends otherwise than the rule says, the cells whose
    state the extra seeds changed, and what the rules give on every cell's first seeds;
    ("", "") where no cell needs or has more."""
    have = [c for c in d.cells if len(c.cell.seeds) > MIN_SEEDS]
    first = first_seeds(d)
    asked = to_extend(d)
    if not have and not asked:
        return "", ""
    labels = {c.cell.label for c in asked}
    rule = "rule v4, written after some runs were seen"
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
    answer, said_first, at_v5 = on_first(first)
    parts.append(f"on every cell's first {MIN_SEEDS} seeds the rules give: {said_first}")
    if answer != "not run yet":
        few.append(f"on {MIN_SEEDS} seeds: {answer}" + at_v5)
    return "; ".join(parts) + ".", "; ".join(few)


def on_first(first: RunsData) -> tuple[str, str, str]:
    """What the rules before v4 give (every cell on its first MIN_SEEDS seeds): (the collapse's
    answer, the whole in words, rule v5's part)."""
    answer, doc = governs(first)[0], thresholds(first)[0].split(" (")[0]
    jitter = governs(first, "jstate")[0]
    v5 = rule_v5(first)[0].split(" (")[0] if read(first, BIG) is not None else ""
    at_v5 = f", the doctor's thresholds at {images(BIG // 2)} per rank {v5}" if v5 else ""
    return answer, (f"the collapse {answer}, the jitter {jitter}, the doctor's thresholds "
                    f"{doc}{at_v5}"), at_v5

