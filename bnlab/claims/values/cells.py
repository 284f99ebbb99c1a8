"""table-values' cells: each against its input's 1 x batch reference, paired on the seed, by
the rules in experiments/values/rules.yaml (applied by bnlab.lab.judge), and what governs the
collapse: a values threshold, an images threshold, both or neither."""

from __future__ import annotations

import math

from bnlab.lab import judge, rules, table
from bnlab.lab.results import CellResult
from bnlab.lab.table import RunsData

RULES = rules.read("values")
BREAK = RULES["break_points"]      # points of accuracy lost to the reference at which a cell breaks
HOLD_BOUND = RULES["hold_bound"]   # a cell holds only where its interval rules out losing this many
MIN_SEEDS = RULES["min_seeds"]
EXTRA_SEEDS = tuple(RULES["extra_seeds"])  # rule v4: an unclear cell's seeds beyond the first
BIG = RULES["big_batch"]           # rule v5's global batch: 2 x BIG // 2 against 1 x BIG


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


def state(gap: float, lo: float | None, hi: float | None, n: int) -> str:
    """breaks, holds or unclear, by rules.yaml's states (bnlab.lab.judge)."""
    return judge.gap_state(RULES, gap, lo, hi, n)


def control(ref: CellResult) -> judge.Control:
    """table-lr's control check on an input's 1 x batch reference: does its jitter stand
    still?"""
    return judge.control_check(RULES, ref, ref.cell.cfg.get("optim", {}).get("lr", math.nan),
                               f"{ref.cell.meta['input']}'s 1 x {batch(ref)} reference")


def measure(d: RunsData, c: CellResult) -> dict | None:
    """The cell against its reference over the seeds the cell has: gap and jitter ratio (with
    intervals), state; None until both have ended every one of those seeds."""
    ref = judge.shared(reference(d, c), c)
    if not (finished(c) and finished(ref)):
        return None
    base = {"label": c.cell.label, "batch": batch(c), "values": values(c),
            "images": c.cell.meta["per_rank"], "input": c.cell.meta["input"],
            "acc": c.jstat("plateau_acc"), "vn": c.jstat("vn_sd")}
    if c is ref:
        return {**base, "gap": 0.0, "lo": None, "hi": None, "jitter": 1.0, "jlo": None,
                "jhi": None, "n": len(c.runs), "state": "reference", "jstate": "reference",
                "why": "diverged" if ref.diverged else ""}
    p = judge.paired(c, ref)
    if ref.diverged:
        st, why = "unclear", "its reference diverged"
    elif p["lost"]:
        st, why = "breaks", f"diverged on seed {', '.join(map(str, p['lost']))}"
    elif base["values"] is None:
        st, why = "unclear", "no bn_values_per_channel in its run.json"
    else:
        st = state(p["gap"], p["lo"], p["hi"], p["n"])
        why = f"{p['n']} seed pairs" if p["n"] < MIN_SEEDS else ""
    jstate = judge.ratio_state(RULES, p["jlo"], p["jn"] if base["values"] is not None else 0,
                               bool(control(ref).ok))
    return {**base, **{k: p[k] for k in ("gap", "lo", "hi", "jitter", "jlo", "jhi", "n")},
            "state": st, "why": why, "jstate": jstate}


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
    """One cell's state and the number it was read from: 'breaks (gap +27.0 pts to 1x8)' (the
    jitter: its ratio), why where a divergence decided it, and whether seeds are to come."""
    x = m["gap"] if key == "state" else m["jitter"]
    number = "" if x is None or not math.isfinite(x) else (
        f"gap {round(x, 1) + 0.0:+.1f} pts to 1x{m['batch']}" if key == "state"
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


def points(ms: list[dict], key: str = "state") -> list[tuple[int, int | None, str]]:
    """The cells as separation reads them: (images, values, state)."""
    return [(m["images"], m["values"], m[key]) for m in ms]


def on_first_seeds(first: RunsData) -> dict[str, dict]:
    """Each cell measured on its first seeds (first_seeds(d)), by label."""
    return {c.cell.label: m for c, m in measured(first)}


def first_seeds(d: RunsData) -> RunsData:
    """Every cell cut to its first MIN_SEEDS seeds: the data as the rules before v4 read it."""
    return judge.first_seeds(d, MIN_SEEDS)


def to_extend(d: RunsData) -> list[CellResult]:
    """The cells rule v4 gives more seeds, with their references (bnlab.lab.judge's seed
    extension): unclear on exactly MIN_SEEDS pairs because the interval is too wide."""
    return judge.asks_more_seeds(d, MIN_SEEDS, measure, reference)


