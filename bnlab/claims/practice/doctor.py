"""What the doctor gets from table-practice: its judgment of the doctor's thresholds on bn's
cells (rules `doctor`, `doctor_change`; bnlab.caveats reads it) and the advice row, every fix at
8 x 2 in table-recover's form (rules `advice`; bnlab.advice reads it), written to
bnlab/measured/practice.json."""

from __future__ import annotations

from pathlib import Path

from bnlab.claims.practice.cells import Practice, bn_states, find, fix_at_two, fixes_at_two
from bnlab.claims.practice.spec import BATCHES, JUDGED, NAMES, RANKS
from bnlab.claims.recover.cells import best_of, entry, fewest_values
from bnlab.doctor import MIN_IMAGES, MIN_VALUES, at_risk
from bnlab.lab import page, table
from bnlab.lab.results import CellResult

WHERE = f"{RANKS} ranks x 2 on resnet20 (CIFAR-10)"


def doctor_judgment(cells: list[CellResult], thresholds: tuple[int, int] = JUDGED) -> dict:
    """The doctor's thresholds (images, values; those rule `doctor` judges unless said) on bn's
    cells at 8, 4 and 2 images per rank: {answer, rows: [{per_rank, values, state, flagged}],
    ended, change}. `ended`: every cell has its seeds (an unclear one leaves the answer
    undecided, naming it); `change` is what `doctor_change` gives (a new MIN_IMAGES, or None
    where the thresholds stay)."""
    states = bn_states(cells)
    images, values = thresholds
    rows = []
    for b in BATCHES[1:]:
        v = fewest_values(find(cells, "bn", b))
        rows.append({"per_rank": b, "values": v, "state": states[b][1],
                     "flagged": None if v is None else at_risk(b, v, min_values=values,
                                                               min_images=images)})
    if any(r["state"] == "to come" or r["flagged"] is None for r in rows):
        return {"answer": "undecided", "rows": rows, "ended": False, "change": None}
    unclear = [f"{RANKS} x {r['per_rank']}" for r in rows if r["state"] == "unclear"]
    if unclear:
        return {"answer": f"undecided (bn unclear at {page.listed(unclear)})", "rows": rows,
                "ended": True, "change": None}
    wrong = [r for r in rows if r["flagged"] != (r["state"] == "breaks")]
    if not wrong:
        return {"answer": "supported", "rows": rows, "ended": True, "change": None}
    named = "; ".join(f"bn {r['state']} at {RANKS} x {r['per_rank']} ({r['per_rank']} images, "
                      f"{r['values']} values), which the doctor "
                      f"{'flags' if r['flagged'] else 'passes'}" for r in wrong)
    breaking = [r["per_rank"] for r in rows if r["state"] == "breaks"]
    holding = [r["per_rank"] for r in rows if r["state"] == "holds"]
    separate = bool(holding) and (not breaking or max(breaking) < min(holding))
    return {"answer": f"not supported ({named})", "rows": rows, "ended": True,
            "change": min(holding) if separate else None}


def doctor_lines(cells: list[CellResult]) -> list[str]:
    """The page's section on the doctor's thresholds: each bn cell flagged or passed at the
    thresholds the rule judges, the answer, what `doctor_change` gives, and the answer at
    bnlab's thresholds now where that change has moved them."""
    j = doctor_judgment(cells)
    rows = [[f"{RANKS} x {r['per_rank']}", str(r["per_rank"]),
             "-" if r["values"] is None else str(r["values"]), r["state"],
             "-" if r["flagged"] is None else "flagged" if r["flagged"] else "passed"]
            for r in j["rows"]]
    moved = (MIN_IMAGES, MIN_VALUES) != JUDGED
    if not j["ended"]:
        then = "The thresholds stay until every bn cell has its seeds."
    elif j["answer"].startswith("undecided"):
        then = "The rule leaves them undecided where a bn cell is unclear: the thresholds stay."
    elif j["change"] is not None:
        done = "became" if j["change"] == MIN_IMAGES else "becomes"
        then = (f"By doctor_change, MIN_IMAGES {done} {j['change']} (the smallest per-rank batch "
                "at which bn holds), in its own commit that names that rule.")
    elif j["answer"] == "supported":
        then = "The thresholds stay."
    elif not any(r["state"] == "holds" for r in j["rows"]):
        then = ("bn holds at no per-rank batch below 16, so doctor_change has no batch to move "
                "MIN_IMAGES to: the thresholds stay, and the doctor says they are not "
                "supported here.")
    else:
        then = ("bn's breaking and holding per-rank batches do not separate, so by "
                "doctor_change the thresholds stay, and the doctor says they are not supported "
                "here.")
    now = ([f"bnlab's thresholds are now {MIN_IMAGES} images and {MIN_VALUES} values "
            "(bnlab/defaults.py); at those: "
            f"**{doctor_judgment(cells, (MIN_IMAGES, MIN_VALUES))['answer']}**.", ""]
           if moved else [])
    flags = "flagged" if moved else "flags"
    when = " when its rule was written, the thresholds judged here" if moved else ""
    return ["## The doctor's thresholds against bn's curve", "",
            f"bnlab's doctor {flags} a BN layer below {JUDGED[0]} images or {JUDGED[1]} values "
            f"per channel per rank (rules: doctor){when}. Here, at resnet20's smallest BN "
            "layer:", "",
            page.md_table(["bn cell", "images per rank", "values per channel per rank",
                           "bn's state", "the doctor"], rows), "",
            f"The thresholds: **{j['answer']}**. {then}", "", *now]


def advice_row(data: Practice, v3: bool = False) -> dict | None:
    """This table's row for the doctor (rules `advice`), in table-recover's form: every fix at
    8 x 2 ({fix, name, state, gain, groups, share, lo, hi}), the best and the best without
    per-step communication (the best state first, then the largest gain; `v3`: as rules
    version 3 read it, the largest gain alone, fix_at_two's v3), the input and its values per
    channel; None until the reference, bn at 8 x 2 and every fix there have their seeds."""
    if data.runs is None:
        return None
    cells = data.runs.cells
    ms = {c.cell.meta["fix"]: (c, fix_at_two(cells, c, v3)) for c in fixes_at_two(cells)}
    if not ms or any(m is None for _, m in ms.values()):
        return None
    return {"table": "table-practice", "input": "resnet20",
            "values": fewest_values(find(cells, "bn", 2)), "where": WHERE,
            "global_batch": 2 * RANKS, "epochs": find(cells, "bn", 2).epochs,
            **best_of({f: entry(f, c, m, NAMES.get(f, f)) for f, (c, m) in ms.items()},
                      by_state=not v3)}


def advice(data: Practice, out: Path) -> None:
    """practice.json for the doctor (bnlab.advice, bnlab.caveats): the advice row once its cells
    have their seeds, and what this table finds of the thresholds (and what doctor_change gives)
    once bn's cells have theirs; removed while it has neither."""
    path = table.measured_path(out, "practice", "practice.json")
    row = advice_row(data)
    j = doctor_judgment(data.runs.cells) if data.runs is not None else {"ended": False}
    got = {**(row or {}), **({"thresholds": {
        "answer": j["answer"], "global_batches": f"{2 * RANKS} to {BATCHES[0] * RANKS}",
        "judged": {"images": JUDGED[0], "values": JUDGED[1]}, "change": j["change"],
        "table": "make table-practice: experiments/practice/table.md in bnlab's repository"}}
        if j["ended"] else {})}
    if not got:
        path.unlink(missing_ok=True)
    else:
        table.save_results(path, got)


def before_v4(data: Practice) -> str:
    """What rules version 3 give where version 4 reads otherwise (rules.yaml `gave`): a best
    fix by gain alone, a fix unclear only where its gap has too few pairs, a share where bn
    diverged; said while the cells are to come, and where both read the same."""
    new, old = advice_row(data), advice_row(data, v3=True)
    if new is None or old is None:
        return "nothing yet: the cells at 8 x 2 are still to come"
    said = lambda e: f"{e['name']} ({e['state']})"  # noqa: E731
    out = [f"{what} {said(old[k])}" for k, what in (
        ("best", "best fix"), ("best_free", "best without per-step communication"))
        if old.get(k) and (new.get(k) is None or new[k]["fix"] != old[k]["fix"])]
    for f, e in old["fixes"].items():
        now = new["fixes"][f]
        if e["state"] != now["state"]:
            out.append(f"{e['name']} {e['state']} where version 4 says {now['state']}")
        if "share" in e and "share" not in now:
            out.append(f"{e['name']} a share of {100 * e['share']:.0f}% of BN's loss where "
                       "version 4 measures none")
    return "; ".join(out) or "the same states, shares and best fixes"
