"""Each claim's verdict, decided by a stated rule from the tables' numbers.

The rules are written here once, in code, so a regenerated table can never disagree with
the verdict printed beside it. `write_readme` replaces the block between the markers in
experiments/README.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bnlab.analysis import Stat
from bnlab.results import CellResult, budget_line

BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
NO_LEARNING = 15.0   # final val acc (%) below which a row did not learn (chance is 10%)


@dataclass
class Verdict:
    claim: str
    command: str
    claimed: str
    ours: str
    verdict: str       # reproduced | partly | not reproduced | not run yet
    why: str


def _m(c: CellResult | None, key: str) -> float | None:
    return None if c is None else c.stat(key).mean


def _s(c: CellResult | None, key: str = "swing") -> str:
    return "-" if c is None else c.stat(key).fmt()


def _pair(x: CellResult | None, y: CellResult | None, lx: str, ly: str) -> str:
    """`swing X ±a, Y ±b; final acc c vs d`: two cells side by side."""
    return f"swing {lx} ±{_s(x)}, {ly} ±{_s(y)}; final acc {_s(x, 'final')} vs {_s(y, 'final')}"


def _missing(*vals) -> bool:
    return any(v is None for v in vals)


def c1(t) -> Verdict:
    j = t["jitter"]
    bn, sb = j.get("bn"), j.get("syncbn")
    a, b = _m(bn, "swing"), _m(sb, "swing")
    ours = "resnet18: " + _pair(bn, sb, "bn", "syncbn")
    cbn, csb = j.get("resnet18_cifar bn"), j.get("resnet18_cifar syncbn")
    if _m(cbn, "swing") is not None or _m(csb, "swing") is not None:
        ours += f"; resnet18_cifar: swing bn ±{_s(cbn)}, syncbn ±{_s(csb)}"
    if _missing(a, b):
        return Verdict("C1", "make table-jitter", "bn ±10, syncbn ±2", ours, "not run yet", "")
    ratio = a / max(b, 1e-9)
    v = "reproduced" if ratio >= 2 and a >= 5 else "partly" if ratio >= 1.5 else \
        "not reproduced"
    why = (f"bn swings {ratio:.1f}x as much as syncbn (rule: reproduced if >= 2x and bn >= ±5; "
           "partly if >= 1.5x).")
    fa = _m(bn, "final")
    if fa is not None and fa < NO_LEARNING + 5:
        why += (f" bn at 4x2 barely learns here (final val acc {fa:.1f}%), so its accuracy has "
                "little room to swing: with torchvision's ImageNet stem a 32x32 image is 1x1 in "
                "layer4, where BN normalizes over 2 values per channel.")
    ca, cb, cf = _m(cbn, "swing"), _m(csb, "swing"), _m(cbn, "final")
    if not _missing(ca, cb, cf):
        why += (f" With resnet18_cifar (layer4 4x4), where bn learns (final val acc {cf:.1f}%), "
                f"bn swings {ca / max(cb, 1e-9):.1f}x as much as syncbn (not ruled on).")
    return Verdict("C1", "make table-jitter", "bn ±10, syncbn ±2", ours, v, why)


def c2(t) -> Verdict:
    cells = t["batch"]
    gaps = {b: (_m(cells.get(f"syncbn {b}"), "final"), _m(cells.get(f"bn {b}"), "final"))
            for b in (2, 16, 32)}
    if any(_missing(*g) for g in gaps.values()):
        return Verdict("C2", "make table-batch", "16+ images per rank mostly restores BN",
                       "-", "not run yet", "")
    gap = {b: s - n for b, (s, n) in gaps.items()}
    ours = ", ".join(f"syncbn - bn at {b}: {gap[b]:+.1f} pts" for b in (2, 16, 32))
    v = "reproduced" if gap[16] <= 2 and gap[2] >= 5 else \
        "partly" if gap[16] < gap[2] / 2 else "not reproduced"
    return Verdict("C2", "make table-batch", "16+ images per rank mostly restores BN", ours, v,
                   "Rule: reproduced if bn is within 2 points of syncbn at 16 images per rank "
                   "while 5+ points behind at 2; partly if the gap at 16 is under half the "
                   "gap at 2.")


def c3(t) -> Verdict:
    one, four = t["ranks"].get("1 rank x 8"), t["ranks"].get("4 ranks x 2")
    a, b = _m(one, "swing"), _m(four, "swing")
    ours = _pair(one, four, "1x8", "4x2")
    if _missing(a, b):
        return Verdict("C3", "make table-ranks", "1x8 far more stable than 4x2", ours,
                       "not run yet", "")
    v = "reproduced" if b >= 2 * a else "partly" if b >= 1.5 * a else "not reproduced"
    why = (f"4x2 swings {b / max(a, 1e-9):.1f}x as much as 1x8 (rule: >= 2x reproduced, "
           ">= 1.5x partly).")
    fb = _m(four, "final")
    if fb is not None and fb < NO_LEARNING + 5:
        why += (f" 4x2 barely learns (final val acc {fb:.1f}%), so its swing says little; "
                "1x8 normalizes over the same 8 images that syncbn at 4x2 does.")
    return Verdict("C3", "make table-ranks", "1x8 far more stable than 4x2", ours, v, why)


def c4(t) -> Verdict:
    j = t["jitter"]
    pairs = {"augmentation off": ("bn, augmentation off", "syncbn, augmentation off"),
             "lr 0.1": ("bn, reports' setting (lr 0.1 constant)",
                        "syncbn, reports' setting (lr 0.1 constant)")}
    parts, outcomes = [], []
    for name, (bl, sl) in pairs.items():
        bn, sb = j.get(bl), j.get(sl)
        a, b = _m(bn, "swing"), _m(sb, "swing")
        fa, fb = _m(bn, "final"), _m(sb, "final")
        if _missing(a, b, fa, fb):
            parts.append(f"{name}: not run yet")
            outcomes.append(None)
            continue
        parts.append(f"{name}: swing bn ±{_s(bn)}, syncbn ±{_s(sb)} (final acc {fa:.1f} / "
                     f"{fb:.1f})")
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


def c5(t) -> Verdict:
    acc, big = t["ranks"].get("4 ranks x 2 + grad_accum 4"), t["ranks"].get("4 ranks x 8")
    a, b = _m(acc, "swing"), _m(big, "swing")
    fa, fb = _m(acc, "final"), _m(big, "final")
    ours = _pair(acc, big, "4x2+accum4", "4x8")
    if _missing(a, b, fa, fb):
        return Verdict("C5", "make table-ranks", "accumulation does not help BN", ours,
                       "not run yet", "")
    v = "reproduced" if a >= 1.5 * b or fb - fa >= 3 else "not reproduced"
    return Verdict("C5", "make table-ranks", "accumulation does not help BN", ours, v,
                   "Rule: reproduced if accumulation leaves a swing >= 1.5x that of the real "
                   "batch of 8 per rank, or an accuracy 3+ points lower.")


def c6(t) -> Verdict:
    bn, fr = t["jitter"].get("bn"), t["jitter"].get("frozen_bn (after epoch 1)")
    a, b = _m(bn, "swing"), _m(fr, "swing")
    ours = _pair(bn, fr, "bn", "frozen")
    if _missing(a, b):
        return Verdict("C6", "make table-jitter", "frozen BN much steadier", ours,
                       "not run yet", "")
    v = "reproduced" if b <= a / 2 else "partly" if b < a else "not reproduced"
    return Verdict("C6", "make table-jitter", "frozen BN much steadier", ours, v,
                   "Rule: reproduced if frozen BN halves the swing; partly if it lowers it.")


def c8(t) -> Verdict:
    pb = t["jitter"].get("bn + PreciseBN every epoch")
    gains = pb.paired("precise", "final") if pb is not None else []
    g = Stat.of(gains)
    ours = f"final acc with EMA statistics {_s(pb, 'final')}, after PreciseBN " \
           f"{_s(pb, 'precise')}; gain on the same weights, per seed: " + \
           (", ".join(f"{d:+.1f}" for d in gains) or "-") + \
           ("" if g.mean is None else f" (mean {g.mean:+.1f}" +
            (f" ± {g.std:.1f})" if g.std is not None else ")"))
    if g.mean is None:
        return Verdict("C8", "make table-jitter", "PreciseBN improves val acc", ours,
                       "not run yet", "")
    up = sum(d > 0 for d in gains)
    v = "reproduced" if g.mean >= 1 and up == len(gains) else \
        "partly" if g.mean > 0 and up > len(gains) / 2 else "not reproduced"
    return Verdict("C8", "make table-jitter", "PreciseBN improves val acc", ours, v,
                   f"PreciseBN raised the final val acc in {up} of {len(gains)} seeds, by "
                   f"{g.mean:+.1f} points on average (rule, on each seed's own weights: "
                   "reproduced if +1 or more on average and up in every seed; partly if up on "
                   "average and in most seeds).")


def c9(t) -> Verdict:
    j = t["jitter"]
    gn, sb, bn = j.get("gn (32 groups)"), j.get("syncbn"), j.get("bn")
    g, s, b = _m(gn, "swing"), _m(sb, "swing"), _m(bn, "swing")
    fg, fs = _m(gn, "final"), _m(sb, "final")
    ours = f"swing gn ±{_s(gn)}, syncbn ±{_s(sb)}, bn ±{_s(bn)}; final acc gn " \
           f"{_s(gn, 'final')} vs syncbn {_s(sb, 'final')}"
    if _missing(g, s, b, fg, fs):
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


def l1(t) -> Verdict:
    cells = t["batch"]
    sizes = (32, 16, 8, 4, 2)
    vals = {(r, b): _m(cells.get(f"{r} {b}"), "final") for r in ("bn", "gn") for b in sizes}
    if _missing(*(vals[r, b] for r in ("bn", "gn") for b in (2, 32))):
        return Verdict("L1", "make table-batch", "BN error grows below 8/GPU; GN flat", "-",
                       "not run yet", "")
    # A row that stayed near chance at some size says nothing about batch size there.
    dead = [f"{r} at {b}" for r in ("bn", "gn") for b in sizes
            if vals[r, b] is not None and vals[r, b] < NO_LEARNING]
    learned = [b for b in sizes if all(vals[r, b] is not None and vals[r, b] >= NO_LEARNING
                                       for r in ("bn", "gn"))]
    note = f" Did not learn (final acc < {NO_LEARNING:g}%): {', '.join(dead)}." if dead else ""
    quarter = [(b, _m(cells.get(f"gn {b}, lr / 4"), "final")) for b in sizes]
    quarter = [f"{v:.1f}% at {b}" for b, v in quarter if v is not None]
    if quarter:
        note += f" gn at a quarter of the rate (not ruled on): final acc {', '.join(quarter)}."
    rule = ("Rule: from the largest size where both rows learned (8 or more) down to 2: "
            "reproduced if bn loses 5+ points and gn under a third of that; partly if gn "
            "loses less than bn.")
    if 2 not in learned or max(learned) < 8:
        return Verdict("L1", "make table-batch", "BN error grows below 8/GPU; GN flat",
                       "no size of 8 or more where both bn and gn learned" + note.rstrip("."),
                       "not reproduced", rule + note)
    top = max(learned)
    dbn = vals["bn", top] - vals["bn", 2]
    dgn = vals["gn", top] - vals["gn", 2]
    ours = f"val acc lost from {top} to 2 images per rank: bn {dbn:.1f}, gn {dgn:.1f} points " \
           "(paper, 32 to 2: 11.1 and 0.0 points of error)"
    v = "reproduced" if dbn >= 5 and dgn <= dbn / 3 else "partly" if dgn < dbn else \
        "not reproduced"
    return Verdict("L1", "make table-batch", "BN error grows below 8/GPU; GN flat", ours, v,
                   rule + note)


RULES: list[Callable] = [c1, c2, c3, c4, c5, c6, c8, c9, l1]


def verdicts(tables: dict[str, dict[str, CellResult]]) -> list[Verdict]:
    return [rule(tables) for rule in RULES]


def write_readme(tables: dict[str, dict[str, CellResult]], tag: str, path: Path) -> None:
    cells = [c for t in tables.values() for c in t.values()]  # shared cells: count runs once
    done = len({r.path for c in cells for r in c.runs})
    expected = len({(c.cell.key, s) for c in cells for s in c.cell.seeds})
    unique = {c.cell.key: c for c in cells}.values()
    short = sum(len(c.runs) < c.expected for c in unique)
    mark = "" if done == expected else " (preliminary)"
    rows = claim_rows(verdicts(tables), mark)
    status = "" if done == expected else (
        f"**Preliminary:** {done} of the {expected} runs the three tables call for have "
        f"finished ({short} of {len(unique)} cells lack seeds); the sweep goes on with "
        "`make tables`, and these verdicts may change. ")
    runs = [r for c in cells for r in c.runs]
    budget = (f"Wall time of all three tables together (`make tables`, shared cells run once): "
              f"{budget_line(runs, expected, 'all')}; each table gives its own.")
    block = "\n".join([BEGIN, f"{status}Generated by `make report` from the runs in "
                       f"`experiments/runs/{tag}/`; the rules are in `bnlab/verdicts.py`.", "",
                       *rows, "", budget, END])
    _replace(path, BEGIN, END, block)
    print(f"wrote the claims' verdicts into {path}")


def _replace(path: Path, begin: str, end: str, block: str) -> None:
    """Put `block` (which starts with `begin` and ends with `end`) in place of the text
    between those markers in `path`, or append it."""
    text = path.read_text() if path.is_file() else "# experiments\n"
    if begin not in text:
        text += f"\n{begin}\n{end}\n"
    head, rest = text.split(begin, 1)
    path.write_text(head + block + rest.split(end, 1)[1])


def claim_rows(vs: list[Verdict], mark: str = "") -> list[str]:
    """The claims' markdown table; `mark` follows each verdict that was decided."""
    rows = ["| claim | command | claimed | ours | verdict | why |", "|---|---|---|---|---|---|"]
    for v in vs:
        verdict = v.verdict + (mark if v.verdict != "not run yet" else "")
        rows.append(f"| {v.claim} | `{v.command}` | {v.claimed} | {v.ours} | **{verdict}** "
                    f"| {v.why} |")
    return rows


def write_block(path: Path, name: str, v: Verdict) -> None:
    """The verdict of a table that is not a sweep (e.g. the pitfalls), between its own
    markers `<!-- name:begin -->` and `<!-- name:end -->`."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    _replace(path, begin, end, "\n".join([begin, *claim_rows([v]), end]))


def write_table(out: Path, text: str, readme: Path, block: str, v: Verdict,
                plot: Callable[[Path], None] | None = None, png: str = "") -> None:
    """A measured table's outputs: `out`/table.md, the figure `png` drawn by `plot(path)`,
    and its verdict between the `block` markers of `readme`."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.md"]
    written[0].write_text(text)
    if plot is not None:
        written.append(out / png)
        plot(written[-1])
    write_block(readme, block, v)
    print("wrote " + " and ".join(map(str, written)))
