"""`make table-values`: where BatchNorm breaks. Accuracy and jitter against the values each BN
channel normalizes over, with the number of samples separated from the number of values.

    python -m bnlab.claims values --data DIR --jobs 2   # sweep (hours on 2 cores), table
    python -m bnlab.claims values --report              # table from the runs' logs only

Trains experiments/values/sweep.yaml: one global batch of 8 images (and, by rule v5, a block
at 16), one learning rate (the pilot's), one data order a seed; only how BN groups the images
changes: 4 ranks x 2, 2 x 4, 1 x 8 (simulated; 1 x 8 with bn computes exactly what syncbn at
4 x 2 does, so it is each input's reference) and 8 x 1 on the 64 px input; on torchvision
resnet18 at 32 px (1x1 maps in layer4), the same at 64 px (2x2) and resnet20 (8x8), so the
smallest BN layer normalizes 2 to 512 values per channel. 10 epochs of the settled headline
protocol, the plateau its second half, 3 seeds (5 where rule v4 adds them). Writes
experiments/values/{table.md, values.png}.

The rules are data in experiments/values/rules.yaml (thresholds, states, answers, versions);
bnlab.lab.judge applies the comparisons; cells.py reads the cells, doctor.py the doctor's
thresholds, rule v4's seeds and rule v5's block, figure.py draws the figure.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from bnlab.caveats import VALUES_TABLE
from bnlab.claims import bf16ddp
from bnlab.claims.values import figure
from bnlab.claims.values.cells import *  # noqa: F403 (the table's names, one namespace)
from bnlab.claims.values.cells import (
    BIG,
    RULES,
    batch,
    control,
    finished,
    first_seeds,
    governs,
    images,
    measure,
    measured,
    read,
    reference,
    values,
)
from bnlab.claims.values.doctor import *  # noqa: F403
from bnlab.claims.values.doctor import (
    count_rules,
    extension,
    on_first,
    rule_v5,
    thresholds,
)
from bnlab.claims.values.doctor import (
    flagged as doctor_flags,
)
from bnlab.doctor import MIN_IMAGES, MIN_VALUES, at_risk
from bnlab.lab import devices, page, rules, table
from bnlab.lab.plan import Spec
from bnlab.lab.results import fmt
from bnlab.lab.spec import spec_from
from bnlab.lab.table import Finding, RunsData, Verdict
from bnlab.paths import RUNS_CUDA


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
           f"it changes no verdict above): {reading}.", ""] if (reading := count_rules(d)) else []),
        *([f"**The doctor's thresholds at {images(BIG // 2)} per rank** (global batch {BIG}: "
           f"2 x {BIG // 2} against 1 x {BIG}, rule v5): **{v5}** "
           f"({v5_cells or 'no cell measured yet'}).", ""] if v5 else []),
        *([f"**On CUDA** (the same cells, the same rules; `make gpu-check`): {x}", ""]
          if (x := on_cuda(d)) else []),
        f"Gap: {RULES.words('measure', 'gap')}. Breaks: {RULES.words('states', 'breaks')}; "
        f"holds: {RULES.words('states', 'holds')}; unclear: "
        f"{RULES.words('states', 'unclear')}. Jitter: {RULES.words('measure', 'jitter')}. "
        "Thresholds: " + rules.said(RULES, "break_points", "hold_bound", "min_seeds") + ". "
        "Plateau: the second half of training. " + "".join(
            f"The {r.cell.meta['input']} 1 x {batch(r)} reference normalizes {values(r)} values "
            "per channel "
            f"over {r.cell.meta['per_rank']} images, itself at risk by the doctor's thresholds: "
            f"gaps there are to syncbn over the same {r.cell.meta['per_rank']} images, not to an "
            "unbroken BN. " for r in refs
            if values(r) and at_risk(r.cell.meta["per_rank"], values(r)))
        + "The rules: below.", "",
        *rules.history(RULES, {"first_seeds": on_first(first_seeds(d))[1],
                               "without_block": "the batch-8 answers above, unchanged (its cells "
                               "enter none of them), and no verdict at 8 images per rank"})]))


def with_gpu_cells(spec: Spec) -> Spec:
    """The spec with its `cuda_cells` (rule v6: cells a GPU alone runs) among its cells."""
    cuda = spec.extra.get("cuda_cells")
    if not cuda:
        return spec
    more = spec_from({"experiment": spec.experiment, "cells": cuda}, spec.path, name=spec.name,
                     here=False)
    return replace(spec, cells=spec.cells + more.cells)


def on_cuda(d: RunsData) -> str | None:
    """The cells' states from the GPU's runs (experiments/runs-cuda beside these), each beside
    this folder's, then whether bf16 moved the break (rule v6); None where no GPU run is
    there."""
    there = devices.elsewhere(replace(d, spec=with_gpu_cells(d.spec)),
                              d.root.with_name(RUNS_CUDA.name))
    if there is None:
        return None
    said = devices.compare(d, there, measure, lambda c: c.cell.meta["input"] + (
        f", global batch {batch(c)}" if batch(c) != 8 else ""))
    return said + (f" **Does bf16 move the break?** {x}" if (x := bf16_moved(there, d)) else "")


def bf16_moved(there: RunsData, cpu: RunsData) -> str | None:
    """Rule v6 on the GPU's runs: each bf16 cell's state beside its fp32 cell's, and the
    answer (moves, does not move, undecided); None where the spec has no bf16 cell. The 4 x 2
    bf16 cell also says what real gloo DDP gave on a CPU (table-bf16ddp's runs beside `cpu`'s,
    at its data tag)."""
    by_label = {c.cell.label: c for c in there.cells}
    pairs = [(c, by_label[c.cell.meta["fp32"]]) for c in there.cells
             if c.cell.meta.get("precision") == "bf16" and c.cell.meta["per_rank"] != batch(c)]
    if not pairs:
        return None
    parts, states = [], []
    for half, full in pairs:
        mh, mf = measure(there, half), measure(there, full)
        if mh is None or mf is None or "unclear" in (mh["state"], mf["state"]):
            states.append("undecided")
        else:
            states.append("moves" if mh["state"] != mf["state"] else "does not move")
        check = f"; {bf16ddp.cross_check(cpu.root, cpu.tag, there.root)}" \
            if half.cell.meta["per_rank"] == 2 else ""
        parts.append(f"{full.cell.label}: " + (devices.said(mh) if mh else "still to come")
                     + f" in bf16 ({path(half)}{check}), " + (devices.said(mf) if mf else
                                                        "still to come")
                     + f" in fp32 ({states[-1]})")
    answer = ("undecided" if "undecided" in states else
              "yes" if "moves" in states else "no, the same state in every cell")
    return f"{answer} ({'; '.join(parts)}; {RULES.words('answers', 'bf16')})."


def path(c) -> str:
    """Which path made a cell's runs: bnlab's simulated ranks in one process (under bf16 close
    to DDP, not exact: docs/training.md) or real ranks, from each run's run.json."""
    ways = sorted({"simulated ranks" if r.info.get("simulated") else
                   f"real {r.info.get('backend') or 'DDP'} ranks" for r in c.runs})
    return " and ".join(ways) or "no run yet"


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # no claim under test is this curve; its findings are stated in table.md


def below(ms: list[dict]) -> str:
    """'; at batch 8 it misses a breaking cell' (or flags a holding one) where the doctor's
    thresholds are not supported at global batch 8 ("" where they are)."""
    held = sum(m["state"] == "holds" and doctor_flags(m) for m in ms)
    missed = sum(m["state"] == "breaks" and not doctor_flags(m) for m in ms)
    said = [f"flags {'a' if held == 1 else held} holding cell{'s' * (held > 1)}" if held else "",
            f"misses {'a' if missed == 1 else missed} breaking cell{'s' * (missed > 1)}"
            if missed else ""]
    return "; at batch 8 it " + " and ".join(x for x in said if x) if held or missed else ""


def short(name: str, before: dict) -> str:
    """An input's name after another's in one sentence: its model dropped where both share it
    ('resnet18 32 px' after 'resnet18 64 px' is '32 px')."""
    model, _, rest = name.partition(" ")
    return rest if rest and before["input"].split(" ")[0] == model else name


def finding(d: RunsData) -> list[Finding]:
    """Where BN breaks, and the doctor's thresholds at 8 images per rank, in a sentence each."""
    ms = read(d)
    if ms is None:
        return [Finding("Where BN breaks: its runs are still to come.", "values", rank=1)]
    if governs(d)[0] == "undecided":
        return [Finding("Where BN breaks is undecided: a cell's seeds leave it unclear.",
                        "values", rules.mark(RULES), rank=1)]
    levels: dict[int, list[dict]] = {}
    for m in ms:
        levels.setdefault(m["images"], []).append(m)
    every = [n for n, cs in sorted(levels.items()) if all(m["state"] == "breaks" for m in cs)]
    some = [f"at {n} on {sum(m['state'] == 'breaks' for m in cs)} of {len(cs)} inputs"
            for n, cs in sorted(levels.items()) if n not in every]
    two = sorted(levels.get(2, []), key=lambda m: m["gap"])
    head = (f"BN breaks at {' or '.join(map(str, every))} image{'s' * (every != [1])} per "
            "rank everywhere" if every else "BN breaks at no level on every input")
    text = head + (f", {', '.join(some)}" if some else "") + (
        f": at 4 x 2 it loses {two[0]['gap']:.1f} (95% CI {fmt(two[0]['lo'])} to "
        f"{fmt(two[0]['hi'])}; {two[0]['input']}) to {two[-1]['gap']:.1f} points "
        f"({fmt(two[-1]['lo'])} to {fmt(two[-1]['hi'])}; {short(two[-1]['input'], two[0])})"
        if len(two) > 1 else "") + "."
    out = [Finding(text, "values", rules.mark(RULES), rank=1)]
    big = read(d, BIG)
    if big is not None:
        broke = [m for m in big if m["state"] == "breaks"]
        held = [m["input"] for m in big if m["state"] == "holds"]
        verdict = rule_v5(d)[0]
        out.append(Finding(
            f"At {images(BIG // 2)} per rank (global batch {BIG}) BN held on "
            f"{' and '.join(held) or 'no input'}"
            + "".join(f", broke on {m['input']} ({m['gap']:.1f} points, 95% CI "
                      f"{fmt(m['lo'])} to {fmt(m['hi'])})" for m in broke)
            + (", as the doctor says" if verdict == "supported" else
               f": the doctor's thresholds there: {verdict}") + below(ms) + ".", "values",
            rules.mark(RULES), rank=6))
    return out


def plot(d: RunsData, path: Path) -> None:
    """The figure, titled with its message: where BN breaks, as the finding says it."""
    figure.plot(d, path, finding(d)[0].text.split(": ")[0])


def thresholds_json(d: RunsData, out: Path) -> None:
    """thresholds.json for the doctor's line on its thresholds: what this table finds of them
    at global batch 8 (rule v3 on) and, by rule v5, at 8 images per rank (global batch 16)."""
    table.save_results(table.measured_path(out, "values", "thresholds.json"), {
        "table": VALUES_TABLE,
        "at": [{"global_batch": 8, "answer": thresholds(d)[0]},
               {"global_batch": BIG, "answer": rule_v5(d)[0] or "not run yet"}]})


TABLE = table.Table("values", (), table.runs_data, render, verdicts, plot, block="settled",
                    headline="values.png", finding=finding, also=thresholds_json)
