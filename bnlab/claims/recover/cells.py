"""table-recover's cells: its inputs and fixes, each cell against bn at 4 x 2 and the 1 x 8
reference paired on the seed (by rules.yaml), and each input's picks for the finding and the
doctor's advice."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from bnlab.advice import FREE
from bnlab.errors import BnlabError
from bnlab.lab import judge, rules, table
from bnlab.lab.results import ONE_AN_EPOCH, SERIES, CellResult, paired_kind
from bnlab.lab.table import RunsData, bench_section
from bnlab.paths import BENCH_RESULTS, EXPERIMENTS

RULES = rules.read("recover")
SPEC = EXPERIMENTS / "recover" / "sweep.yaml"
MIN_SEEDS = RULES["min_seeds"]
SEEDS = list(range(MIN_SEEDS))
# The inputs (rules.yaml `cells`) and their model override; the 1 x 8 reference and bn at 4 x 2
# are table-values' cells, overrides as there (so its runs are reused). Each fix runs at what
# resnet20's pilot chose (experiments/recoverpilot/sweep.yaml: the 32 px pilot was dropped).
INPUTS = {"resnet20": "model=resnet20", "resnet18 32 px": "model=resnet18"}
FIRST = next(iter(INPUTS))
WORDS = {"resnet18 32 px": "torchvision resnet18 at 32 px"}  # each input as a user reads it


def reference(model: str) -> list[str]:
    return [model, "norm=bn", "dist.simulate=1", "batch_per_gpu=8", "epochs=10",
            "optim.lr=0.00625"]


def bn_at_the_break(model: str) -> list[str]:
    return [model, "norm=bn", "dist.simulate=4", "batch_per_gpu=2", "epochs=10",
            "optim.lr=0.00625"]

COMMUNICATION_FREE = FREE  # no per-step communication (bnlab.advice, which the doctor reads)
# the README's two-input finding, within its word budget, names SyncBN as the claims do
SHORT = {"syncbn": "SyncBN", "syncbn2": "SyncBN in pairs of ranks", "gnws": "GroupNorm+WS"}
# each fix as the finding, the doctor and the page's legend name it, with its spec name
NAMES = {"syncbn": "SyncBN over all 4 ranks", "syncbn2": "SyncBN in groups of 2 ranks",
         "gn": "GroupNorm", "gnws": "GroupNorm + Weight Standardization", "ln": "LayerNorm",
         "evonorm": "EvoNorm-S0",
         "precise": "BN with PreciseBN every epoch", "brn": "Batch Renormalization",
         "frozen_bn": "frozen BN"}


Recover = table.Pending  # the table's data: its runs where its spec exists, else why it waits


# the evaluations each fix's plateau is read from where not val/acc (rules.yaml `reads`, by its
# log key): the precise rows read the one just after each epoch end's recalibration
RECAL = {acc: k for k, (acc, _) in SERIES.items() if k in ONE_AN_EPOCH and acc != "val/acc"}
READS = {fix: RECAL.get(key) for fix, key in RULES.raw.get("reads", {}).items()}
if None in READS.values():
    raise BnlabError(f"{RULES.path}: `reads` names a log key no once-an-epoch evaluation "
                     f"logs; use one of {sorted(RECAL)}.")


def load(ctx: table.Context) -> Recover:
    data = table.pending(ctx, "its spec is written from the pilot's choices once every fix "
                         "is chosen (`python -m bnlab.claims recover-spec`); see "
                         "table-recoverpilot")
    if data.runs is not None:
        read_by_rule(data.runs)
    return data


def read_by_rule(d: RunsData) -> RunsData:
    """Each cell set to read the evaluations rules.yaml `reads` names for its fix (in place)."""
    for c in d.cells:
        c.kind = READS.get(c.cell.meta.get("fix"), c.kind)
    return d


def read_as(data: Recover, version: int) -> Recover:
    """The same runs read as an earlier rules version read them (a copy; `data` keeps its
    readings): 2, every cell at val/acc; 3, the precise cells at val/acc_precise beside the
    others at every evaluation of their plateau (version 4 reads those at epoch ends)."""
    if data.runs is None:
        return data
    kind = {2: lambda c: "ema", 3: lambda c: "all" if c.kind == "ema" else c.kind}[version]
    cells = [dataclasses.replace(c, kind=kind(c)) for c in data.runs.cells]
    return dataclasses.replace(data, runs=dataclasses.replace(data.runs, cells=cells))


def name(c: CellResult) -> str:
    """The cell's fix as a reader names it (a superseded cell's name says its setting)."""
    fix = c.cell.meta["fix"]
    return c.cell.meta.get("name") or NAMES.get(fix, fix)


def where(c: CellResult) -> str:
    """The cell's input (resnet20 where the spec names none)."""
    return c.cell.meta.get("input", FIRST)


def by_fix(d: RunsData, fix: str, on: str = FIRST) -> CellResult | None:
    """The input's one cell of `fix`; refused where the spec has two (a fix at a second setting
    takes its own fix name, e.g. gn8, so that neither is read for the other)."""
    found = [c for c in d.cells if c.cell.meta.get("fix") == fix and where(c) == on]
    if len(found) > 1:
        raise BnlabError(f"{d.spec.path} has {len(found)} cells of fix '{fix}' on {on}; give "
                         "each setting its own fix name (e.g. gn8) so each is read alone.")
    return found[0] if found else None


def per_seed(c: CellResult, beside: str = "ema") -> dict[int, float]:
    """Plateau accuracy by seed, over the seeds that did not diverge, read as beside a cell
    read at `beside` (results.paired_kind)."""
    out = {}
    for r in c.runs:
        acc = None if r.diverged else \
            r.jitter(c.epochs, paired_kind(c.kind, beside)).get("plateau_acc")
        if acc is not None:
            out[r.seed] = acc
    return out


def share(c: CellResult, bn: CellResult, ref: CellResult) -> tuple[float, float | None,
                                                                      float | None]:
    """The share of bn's loss the fix recovers: its mean gain over bn's mean gap, over the seeds
    all three ended, with a bootstrap interval over seeds (rules.yaml `recovered_share`)."""
    a, b, r = per_seed(c), per_seed(bn, c.kind), per_seed(ref, c.kind)
    seeds = sorted(set(a) & set(b) & set(r))
    return judge.ratio_of_means([a[s] - b[s] for s in seeds], [r[s] - b[s] for s in seeds])


def state(g: dict, gain: dict, lost: bool, by: rules.Rules = RULES) -> str:
    """recovers, partly, no better or unclear, by rules.yaml (`by`: another table's rules of
    the same form, table-converge's)."""
    if lost:
        return "no better"
    if min(g["n"], gain["n"]) < by["min_seeds"] or g["lo"] is None or gain["lo"] is None:
        return "unclear"
    if g["gap"] < by["recovers_gap"] and g["hi"] < by["recovers_interval"]:
        return "recovers"
    if gain["lo"] <= 0:
        return "no better"
    if g["lo"] > 0:
        return "partly"
    return "unclear"


def measure(d: RunsData, c: CellResult, by: rules.Rules = RULES) -> dict | None:
    """The fix against the reference and bn, over the seeds all three ended; None while any
    of their seeds is to come (`by`: the rules, as state())."""
    ref, bn = by_fix(d, "reference", where(c)), by_fix(d, "bn", where(c))
    if ref is None or bn is None or not table.complete(c, ref, bn):
        return None
    g, gain, b = judge.paired(c, ref), judge.paired(bn, c), judge.paired(bn, ref)
    breaks = b["n"] >= by["min_seeds"] and b["lo"] is not None and \
        b["gap"] >= by["break_points"] and b["lo"] > 0  # bn's own gap: does it break?
    s = share(c, bn, ref) if breaks else (math.nan, None, None)
    lost = bool(judge.pairs(c, ref)[2])
    return {"gap": g, "gain": gain, "share": s, "bn_breaks": breaks,
            "state": state(g, gain, lost, by) if c is not bn else "bn"}


def step_times(folder: Path = BENCH_RESULTS) -> dict[str, dict[str, float]]:
    """Each fix's step time over bn's on resnet20, by machine, from `make bench`'s fixes
    section (its rows name their fix); machines without such rows left out."""
    out = {machine: {r["fix"]: r["ratio"] for r in b["rows"]
                     if r.get("fix") and r.get("ratio") is not None}
           for machine, b in bench_section("fixes", folder).items()}
    return {machine: t for machine, t in out.items() if t}


def step_time(c: CellResult, times: dict[str, float]) -> str:
    fix = c.cell.meta.get("fix")
    if where(c) != FIRST or fix == "reference":
        return "-"
    if fix == "precise":
        return "bn's + recalibration"
    if fix == "bn":
        return "1x"
    if fix not in times:
        return "-"
    return f"{times[fix]:.2f}x" + (" once frozen" if fix == "frozen_bn" else "")


def pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def on_input(data: Recover, inp: str = FIRST) -> dict[str, tuple[CellResult, dict]] | None:
    """Each fix measured on one input, by fix, with the cell it was measured on; None until
    all are. A fix whose new cells (frompilot.grown) still lack seeds reads its superseded
    cell meanwhile; a new fix with nothing measured yet is left out until it is."""
    d = data.runs
    cells = [] if d is None else [c for c in d.cells if where(c) == inp
                                  and c.cell.meta.get("fix") not in ("reference", "bn")]
    old = {c.cell.meta["of"]: c for c in cells if c.cell.meta.get("superseded")}
    ms = {}
    for c in cells:
        fix = c.cell.meta["fix"]
        if c.cell.meta.get("superseded"):
            continue
        m = measure(d, c)
        if m is None and fix in old and (was := measure(d, old[fix])) is not None:
            c, m = old[fix], was
        elif m is None and c.cell.meta.get("added") and fix not in old:
            continue  # a fix the pilot added later, still to come
        ms[fix] = (c, m)
    return None if not ms or any(m is None for _, m in ms.values()) else ms


def groups_of(c: CellResult) -> dict:
    """{"groups": N} for a cell that sets a group count (capped at 32 where it says so), else
    {}: the setting the doctor's gn line quotes."""
    over = c.cell.overrides
    given = [int(o.split("=")[1]) for o in over if o.startswith("norm.groups=")]
    return {"groups": given[0]} if given else \
        {"groups": 32} if "norm.cap_groups=true" in over else {}


def values_at_the_break(data: Recover, inp: str) -> int | None:
    """The fewest values per channel per rank of the input's bn at 4 x 2 (its smallest BN
    layer), from its runs' run.json."""
    return fewest_values(by_fix(data.runs, "bn", inp) if data.runs is not None else None)


def fewest_values(c: CellResult | None) -> int | None:
    """The fewest values per channel per rank at the cell's smallest BN layer, from its runs'
    run.json; None where no run recorded them."""
    counts = [min(r.info["bn_values_per_channel"].values()) for r in (c.runs if c else [])
              if r.info.get("bn_values_per_channel")]
    return min(counts) if counts else None


def entry(fix: str, c: CellResult, m: dict, called: str | None = None) -> dict:
    """`fix`, measured on cell `c` (a superseded cell stands in for its fix), as advice.json
    holds it: {fix, name, state, gain, groups, share, lo, hi}, the share where bn breaks
    (table-converge's and table-practice's files hold the same form; `called`: the name
    another table gives it)."""
    return {"fix": fix, "name": called or name(c), "state": m["state"],
            "gain": m["gain"]["gap"], **groups_of(c),
            **({"share": m["share"][0], "lo": m["share"][1], "hi": m["share"][2]}
               if math.isfinite(m["share"][0]) else {})}


def picks(data: Recover, inp: str = FIRST) -> dict | None:
    """On one input: the best fix and the best one without per-step communication, and every
    fix by name, each as advice.json holds it ({fix, name, state, gain, share, lo, hi}), with
    the input, its values per channel at the break and where it was measured; None until every
    cell of the input has its seeds."""
    ms = on_input(data, inp)
    if ms is None:
        return None
    return {"input": inp, "values": values_at_the_break(data, inp),
            "where": f"4 ranks x 2 on {WORDS.get(inp, inp)} (CIFAR-10)",
            **best_of({f: entry(f, c, m) for f, (c, m) in ms.items()})}


# the states, best first: table-practice's best fix is the one with the best state, then the
# largest gain (its rules `advice`, version 4)
STATE_ORDER = ("recovers", "partly", "unclear", "no better")


def best_of(fixes: dict[str, dict], by_state: bool = False) -> dict:
    """{best, best_free, fixes}: the fix entries (entry()) with the largest gain over bn, over
    all and over those without per-step communication (None where none is measured);
    `by_state`: the best state first (STATE_ORDER), the largest gain among those."""
    def rank(f: str) -> tuple:
        st = -STATE_ORDER.index(fixes[f]["state"]) if by_state else 0
        return st, fixes[f]["gain"]
    free = [f for f in fixes if f in COMMUNICATION_FREE]
    return {"best": fixes[max(fixes, key=rank)],
            "best_free": fixes[max(free, key=rank)] if free else None, "fixes": fixes}
