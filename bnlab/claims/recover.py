"""`make table-recover`: what to use instead of BN at the break. Every fix at 4 ranks x 2
images on resnet20 and on resnet18 at 32 px, each at the rate (and setting) resnet20's pilot
chose on held-out data, against the input's 1 x 8 BN reference and bn at 4 x 2 itself, paired
on the seed.

    python -m bnlab.claims recover-spec                # experiments/recover/sweep.yaml from
                                                       # the pilot's choices (bnlab/claims/
                                                       # frompilot.py), once all are made
    python -m bnlab.claims recover --data DIR --jobs 2 # its sweep (hours on 2 cores), the table
    python -m bnlab.claims recover --report            # the table from the runs' logs only

The rules are data in experiments/recover/rules.yaml, committed before any final run
(bnlab.lab.judge applies the comparisons). Per fix: its gap to the reference, its gain over bn
(the fix's plateau accuracy minus bn's), the share of bn's loss it recovers (its mean gain
over bn's mean gap, with a bootstrap interval over seeds; read only where bn breaks), and its
state: recovers, partly, no better, unclear, or undecided while runs are to come; beside them,
not ruled, its step time over bn's from `make bench ONLY=fixes` (benchmarks/results/). The
1 x 8 and bn 4 x 2 cells are table-values' runs (the same overrides). resnet20's runs come
first: its ranking writes the README's finding and bnlab/measured/advice.json (the doctor's fix
lines: package data, so an installed bnlab quotes what the checkout does). Writes
experiments/recover/{table.md, recover.png} and that advice.json.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from bnlab.advice import said
from bnlab.errors import BnlabError
from bnlab.lab import judge, page, rules, table
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import CellResult, fmt
from bnlab.lab.table import Finding, RunsData, Verdict, bench_section
from bnlab.paths import BENCH_RESULTS, CONFIGS, EXPERIMENTS, MEASURED

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

# no per-step communication (PreciseBN all-reduces once per recalibration)
COMMUNICATION_FREE = ("gn", "gnws", "ln", "evonorm", "brn", "precise", "frozen_bn")
# the README's two-input finding, within its word budget, names SyncBN as the claims do
SHORT = {"syncbn": "SyncBN", "syncbn2": "SyncBN in pairs of ranks"}
# each fix as the finding, the doctor and the page's legend name it, with its spec name
NAMES = {"syncbn": "SyncBN over all 4 ranks", "syncbn2": "SyncBN in groups of 2 ranks",
         "gn": "GroupNorm", "gnws": "GroupNorm + Weight Standardization", "ln": "LayerNorm",
         "evonorm": "EvoNorm-S0",
         "precise": "BN with PreciseBN every epoch", "brn": "Batch Renormalization",
         "frozen_bn": "frozen BN"}


# ----------------------------------------------------------------------------------------
# The cells against bn and the reference


@dataclass
class Recover:
    """The table's data: its runs where its spec exists, else why it waits."""

    runs: RunsData | None
    waiting: str = ""


def load(ctx: table.Context) -> Recover:
    if not ctx.table.spec_path.is_file():
        return Recover(None, "its spec is written from the pilot's choices once every fix is "
                       "chosen (`python -m bnlab.claims recover-spec`); see table-recoverpilot")
    return Recover(table.runs_data(ctx))


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


def per_seed(c: CellResult) -> dict[int, float]:
    """Plateau accuracy by seed, over the seeds that did not diverge."""
    out = {}
    for r in c.runs:
        acc = None if r.diverged else r.jitter(c.epochs).get("plateau_acc")
        if acc is not None:
            out[r.seed] = acc
    return out


def share(c: CellResult, bn: CellResult, ref: CellResult) -> tuple[float, float | None,
                                                                      float | None]:
    """The share of bn's loss the fix recovers: its mean gain over bn's mean gap, over the seeds
    all three ended, with a bootstrap interval over seeds (rules.yaml `recovered_share`)."""
    a, b, r = per_seed(c), per_seed(bn), per_seed(ref)
    seeds = sorted(set(a) & set(b) & set(r))
    return judge.ratio_of_means([a[s] - b[s] for s in seeds], [r[s] - b[s] for s in seeds])


def state(g: dict, gain: dict, lost: bool, by: rules.Rules = RULES) -> str:
    """recovers, partly, no better or unclear, by rules.yaml (`by`: another table's rules of
    the same form, table-converge's)."""
    if lost:
        return "no better"
    if g["n"] < by["min_seeds"] or g["lo"] is None or gain["lo"] is None:
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


def render(data: Recover) -> str:
    if data.runs is None:
        return "\n".join(["# What to use instead of BN at 4 ranks x 2", "",
                          "Generated by `make table-recover` (`python -m bnlab.claims recover`)"
                          "; do not edit.", "", f"Not run yet: {data.waiting}.", "",
                          *rules.history(RULES)])
    d, times = data.runs, step_times()
    rows = []
    for c in d.cells:
        ref = c.cell.meta.get("fix") == "reference"
        m = None if ref else measure(d, c)
        rows.append([c.cell.label, c.seeds_note(), c.jstat("plateau_acc").fmt(1),
                     c.jstat("vn_sd").fmt(2), c.jstat("churn_floor").fmt(2), *(
                         ["-"] * 3 + ["reference" if ref else "undecided (runs still to come)"]
                         if m is None else
                         [f"{m['gap']['gap']:+.1f} ({fmt(m['gap']['lo'])} to "
                          f"{fmt(m['gap']['hi'])})",
                          "-" if m["state"] == "bn" else
                          f"{m['gain']['gap']:+.1f} ({fmt(m['gain']['lo'])} to "
                          f"{fmt(m['gain']['hi'])})",
                          "-" if m["state"] == "bn" or not math.isfinite(m["share"][0]) else
                          f"{100 * m['share'][0]:.0f}% ({fmt(pct(m['share'][1]), 0)} to "
                          f"{fmt(pct(m['share'][2]), 0)})", m["state"]]),
                     *(step_time(c, t) for t in times.values())])
    return table.runs_page(d, "\n".join([
        page.md_table(["cell", "seeds", "plateau acc (%)", "von Neumann sd (pts)",
                       "churn floor (pts)", "gap to 1x8 (pts, 95% CI)",
                       "gain over bn (pts, 95% CI)", "share of bn's loss recovered (95% CI)",
                       "state", *(f"step time over bn's ({m})" for m in times)], rows), "",
        "Fixes: " + "; ".join(f"{f}: {name}" for f, name in NAMES.items()) + ". "
        + superseded(d) +
        f"Each fix runs at the rate (and setting) {FIRST}'s pilot chose on held-out data "
        "(table-recoverpilot), on both inputs: the 32 px input's own pilot was dropped to fit "
        "the compute budget, so its rates may not be its best. "
        "Gap: the 1 x 8 reference's plateau accuracy minus the cell's (positive: accuracy "
        "lost), paired on the seed; gain: the cell's minus bn 4 x 2's; share: the mean gain "
        "over bn's mean gap, with a bootstrap interval over seeds.", "",
        states_in_words(), "",
        *precise_note(d),
        beside_others(), "",
        "Step time (shown, not ruled): each fix's training step over bn's on resnet20 at 4 "
        "simulated ranks x 2 in one process, measured side by side by `make bench ONLY=fixes` "
        "(benchmarks/results/; docs/performance.md). On a CPU in one process syncbn's "
        "collectives are local copies, so its figure is its arithmetic alone; bn + PreciseBN "
        "steps as bn does and adds one recalibration an epoch (the precisebn section); frozen "
        "BN steps as bn does until it freezes. "
        + ("" if times else "No measurement that names its fix yet (rows measured before "
           "they did are not read): run `make bench ONLY=fixes`."), "",
        *rules.history(RULES)]))


def superseded(d: RunsData) -> str:
    """A sentence on the cells kept as measured at a setting the pilot no longer chooses
    (bnlab/claims/frompilot.py), if any: they are shown, never advised."""
    old = [c for c in d.cells if c.cell.meta.get("superseded")]
    if not old:
        return ""
    return (f"Superseded cells ({', '.join(c.cell.label for c in old)}) ran at the pilot's first "
            f"choice; {old[0].cell.meta['superseded']}, so these stay as measured, and the "
            "fix's new cells are what the finding and the doctor read once they have every "
            "seed (until then, the superseded cells, named with their setting). ")


def precise_note(d: RunsData) -> list[str]:
    """What the precise rows measure: val/acc, as every row, which PreciseBN's epoch-end
    recalibration no longer touches by the next evaluation (the running statistics' EMA has
    replaced it), counted as the evaluations where a precise run's val acc equals its seed's bn
    run; reading its val/acc_precise instead would be a rule change after the data were seen."""
    same, total = 0, 0
    for inp in INPUTS:
        p, b = by_fix(d, "precise", inp), by_fix(d, "bn", inp)
        for r in (p.runs if p and b else []):
            twin = next((x for x in b.runs if x.seed == r.seed), None)
            if twin is None:
                continue
            acc = {row["step"]: row["val/acc"] for row in twin.rows if "val/acc" in row}
            mine = [(row["step"], row["val/acc"]) for row in r.rows if "val/acc" in row]
            same += sum(acc.get(s) == v for s, v in mine)
            total += len(mine)
    if not total:
        return []
    return [f"The precise rows read val/acc, as every row does: PreciseBN recalibrates at epoch "
            "ends, and by the next evaluation the running statistics' EMA has replaced what it "
            f"set, so these rows measure BN trained beside it: {same} of their {total} "
            "evaluations equal their seed's bn run exactly. table-fixes reads the evaluations "
            "just after each recalibration (C8). Reading val/acc_precise here would be a rule "
            "change after the data were seen; it is not made.", ""]


def states_in_words(by: rules.Rules = RULES) -> str:
    """The states in plain words, with the two readings a reader trips on (the rules, as data,
    are below the page's table in rules.yaml)."""
    return (f"States: **recovers**: the fix ends within {by['recovers_gap']:g} points of the "
            f"1 x 8 reference, and its interval rules out losing {by['recovers_interval']:g} or "
            "more. **partly**: clearly better than bn (its gain's interval above 0) and clearly "
            "short of the reference (its gap's interval above 0). **no better**: its gain's "
            "interval reaches 0 (the seeds cannot tell it from bn), or it diverged where the "
            "reference did not. **unclear**: anything else, or fewer than "
            f"{by['min_seeds']} seed pairs. Two readings follow from these: a fix can be "
            "unclear above a weaker one that is partly, where its gap is small but its interval "
            f"reaches below 0 and above {by['recovers_interval']:g} points (it may recover "
            "fully or not: the seeds cannot say); and a share interval above 0 can sit beside "
            "no better, because the share's interval (a bootstrap over seeds, shown) is not "
            "what the state reads: the state reads the gain's t interval over the paired seeds, "
            "which is wider with 5 seeds.")


def beside_others() -> str:
    """Where this table's answer sits beside the README's other GroupNorm numbers: table-fixes
    ran gn at its own rate and length, make demo trains this table's second input."""
    raw = yaml.safe_load((EXPERIMENTS / "fixes" / "sweep.yaml").read_text())
    gn = next(c for c in raw["cells"] if c.get("fix") == "gn")
    rate, here = gn["lr"], float(reference("")[-1].split("=")[1])
    groups = next((o.split("=")[1] for o in gn["overrides"] if o.startswith("norm.groups=")),
                  "32")
    return (f"Beside the other tables: table-fixes (the README's finding 4) measured GroupNorm "
            f"({groups} groups) on resnet20 at lr {rate:g}, 1/{here / rate:g} of the rate here, "
            "over 20 epochs "
            "with bn at that same rate; here each fix runs at the rate its own held-out pilot "
            "chose, over 10 epochs (table-converge trains them 4x longer), so the two rank "
            "GroupNorm on different protocols. `make demo` trains torchvision resnet18 at 32 "
            "px, this table's second input, where BN normalizes 2 values per channel per rank.")


def pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def plot(data: Recover, path: Path) -> None:
    """Each measured fix's share of bn's loss recovered with its interval, one row a fix, best
    first within each input: 0% is bn at 4 x 2, 100% the 1 x 8 reference (so both inputs read
    on one axis)."""
    d = data.runs
    ms = [] if d is None else [(c, m) for c in d.cells
                               if c.cell.meta.get("fix") not in ("reference", "bn")
                               and (m := measure(d, c)) is not None
                               and math.isfinite(m["share"][0])]
    inputs = list(INPUTS)
    ms.sort(key=lambda cm: (inputs.index(where(cm[0])), -cm[1]["share"][0]))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.38 * max(len(ms), 4)))
    for i, (c, m) in enumerate(ms):
        s, lo, hi = (100 * x if x is not None else None for x in m["share"])
        err = [[s - lo], [hi - s]] if lo is not None else None
        ax.errorbar([s], [-i], xerr=err, fmt="o", capsize=3,
                    color=f"C{inputs.index(where(c))}")
    if ms:
        ax.axvline(0, color="C3", lw=1, label="bn at 4 x 2")
        ax.axvline(100, color="grey", ls="--", lw=1, label="the 1 x 8 reference")
        ax.set_yticks([-i for i in range(len(ms))],
                      [f"{where(c)}: {name(c)}" for c, _ in ms])
        ax.legend(fontsize=8, loc="lower right")
    else:
        nothing_yet(ax, data.waiting or "no fix has all its seeds and its references yet")
        ax.set_yticks([])
    ax.set(xlabel="share of BN's loss recovered (%, 95% CI over seeds)",
           ylabel="input: fix, best first",
           title="0% = BN at 4 x 2, 100% = the 1 x 8 reference" if ms else "")
    ax.grid(alpha=0.3, axis="x")
    best = {inp: p["best"]["name"] for inp in inputs if (p := picks(data, inp)) is not None}
    save(fig, path, "What to use instead of BN at 4 ranks x 2" + (
        "\nbest: " + "; ".join(f"{b} on {i}" for i, b in best.items())
        if best else ""))


def verdicts(data: Recover) -> list[Verdict]:
    return []  # no claim under test: a ranking of fixes, stated on its page


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
    bn = by_fix(data.runs, "bn", inp) if data.runs is not None else None
    counts = [min(r.info["bn_values_per_channel"].values()) for r in (bn.runs if bn else [])
              if r.info.get("bn_values_per_channel")]
    return min(counts) if counts else None


def picks(data: Recover, inp: str = FIRST) -> dict | None:
    """On one input: the best fix and the best one without per-step communication, and every
    fix by name, each as advice.json holds it ({fix, name, state, gain, share, lo, hi}), with
    the input, its values per channel at the break and where it was measured; None until every
    cell of the input has its seeds."""
    ms = on_input(data, inp)
    if ms is None:
        return None
    fixes = {f: {"fix": f, "name": name(c), "state": m["state"],
                 "gain": m["gain"]["gap"], **groups_of(c),
                 **({"share": m["share"][0], "lo": m["share"][1], "hi": m["share"][2]}
                    if math.isfinite(m["share"][0]) else {})}
             for f, (c, m) in ms.items()}
    gain = lambda f: fixes[f]["gain"]  # noqa: E731
    free = [f for f in fixes if f in COMMUNICATION_FREE]
    return {"input": inp, "values": values_at_the_break(data, inp),
            "where": f"4 ranks x 2 on {WORDS.get(inp, inp)} (CIFAR-10)",
            "best": fixes[max(fixes, key=gain)],
            "best_free": fixes[max(free, key=gain)] if free else None, "fixes": fixes}


def ranked(p: dict) -> str:
    """One input's ranking in a clause: each fix that does better than bn, best first, with the
    share of bn's loss it gets back and its interval, then the fixes ruled no better."""
    fixes = sorted(p["fixes"].values(), key=lambda e: -e["gain"])
    better = [e for e in fixes if e["state"] != "no better"]
    worse = [e["name"] for e in fixes if e["state"] == "no better"]
    parts = []
    for i, e in enumerate(better):
        if e.get("share") is None or e.get("lo") is None:
            parts.append(said(e))
        elif i == 0:
            parts.append(f"{e['name']} gets back {100 * e['share']:.0f}% of BN's loss (95% CI "
                         f"{100 * e['lo']:.0f} to {100 * e['hi']:.0f})")
        else:
            parts.append(f"{e['name']} {100 * e['share']:.0f}% ({100 * e['lo']:.0f} to "
                         f"{100 * e['hi']:.0f})")
    free = [f for f in p["fixes"] if f in COMMUNICATION_FREE]
    if not better:
        tail = "no fix beats BN"
    elif free and all(p["fixes"][f]["state"] == "no better" for f in free):
        tail = "no fix without per-step communication beats BN"
    else:
        tail = (f"{', '.join(worse)} do{'es' * (len(worse) == 1)} no better than BN"
                if worse else "")
    head = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)
    return "; ".join(x for x in (head, tail) if x)


def best_two(p: dict, first: bool = True) -> str:
    """One input's answer in a clause short enough to sit beside another's: its best fix with
    the share of BN's loss it gets back (`first`: in full words, else as a bare share), then
    the best without per-step communication, or that none beats BN."""
    def share(e: dict, words: bool) -> str:
        if e.get("share") is None or e.get("lo") is None:
            return said(e)
        ci = f"{100 * e['lo']:.0f} to {100 * e['hi']:.0f}"
        name = SHORT.get(e["fix"], e["name"])
        return (f"{name} gets back {100 * e['share']:.0f}% of BN's loss (95% CI {ci})"
                if words else f"{name} {100 * e['share']:.0f}% ({ci})")

    best, free = p["best"], p.get("best_free")
    if best["state"] == "no better":
        return "no fix beats BN"
    if free is not None and free["fix"] == best["fix"]:
        return share(best, first)
    tail = ("none without cross-GPU communication does"
            if free is None or free["state"] == "no better" else
            f"without cross-GPU communication {share(free, False)}")
    return f"{share(best, first)}, {tail}"


def finding(data: Recover) -> list[Finding]:
    """What to use instead of BN at 4 x 2 in one sentence: on the first input alone, every fix
    that does better than bn and those ruled no better;
    once both inputs are measured, each input (with its values per channel at the break) by
    its best fix and its best without per-step communication, within the README's word
    budget; none until the first input has every seed."""
    done = {inp: p for inp in INPUTS if (p := picks(data, inp)) is not None}
    if FIRST not in done:
        return []
    if len(done) == 1:  # it names its input; the page says which are to come
        text = f"At 4 x 2 on {FIRST}, {ranked(done[FIRST])}"
    else:
        text = "At 4 x 2, " + "; ".join(
            f"on {inp.replace(' 32 px', ' at 32 px')}"
            + (f" ({p['values']} values{' per channel' * (i == 0)})" if p.get("values") else "")
            + f" {best_two(p, i == 0)}" for i, (inp, p) in enumerate(done.items()))
    return [Finding(text + ".", "recover", rules.mark(RULES), rank=2, after=reconciled())]


def reconciled() -> str:
    """Why this table's GroupNorm on resnet20 and table-fixes' (the README's finding 4) read
    differently, and where the longer runs stand, in plain words."""
    raw = yaml.safe_load((EXPERIMENTS / "fixes" / "sweep.yaml").read_text())
    gn = next(c for c in raw["cells"] if c.get("fix") == "gn")
    epochs = next((int(o.split("=")[1]) for o in gn["overrides"] if o.startswith("epochs=")),
                  yaml.safe_load((CONFIGS / "experiment" / f"{raw['experiment']}.yaml")
                                 .read_text())["epochs"])  # its protocol's length
    here = float(reference("")[-1].split("=")[1])
    return (f"Findings 2 and 4 rank GroupNorm on resnet20 differently because their protocols "
            f"differ. Finding 4 trains {epochs} epochs at 1/{here / gn['lr']:g} of the default "
            f"rate, BN at that same rate; finding 2 trains 10 epochs, each fix at the rate its "
            "own held-out pilot chose. Whether finding 2's ranking holds 4x longer is "
            "table-converge's question.")


def advice_path(out: Path) -> Path:
    """Where advice.json goes: into the package (bnlab/measured/, what bnlab.advice reads and
    the wheel ships) when the table is built into the repository's experiments/, else beside
    the table (a build elsewhere, as the tests make, leaves the package alone)."""
    return MEASURED / "advice.json" if out.resolve() == (EXPERIMENTS / "recover").resolve() \
        else out / "advice.json"


def advice(data: Recover, out: Path) -> None:
    """advice.json for the doctor's fix lines (bnlab.advice): every input's picks() once its
    cells have their seeds (the doctor cites the input nearest its model in values per channel);
    removed while no input has them."""
    path = advice_path(out)
    inputs = [p for inp in INPUTS if (p := picks(data, inp)) is not None]
    if not inputs:
        path.unlink(missing_ok=True)
    else:
        table.save_results(path, {"inputs": inputs})


TABLE = table.Table("recover", (), load, render, verdicts, plot, block="recover",
                    headline="recover.png", finding=finding, also=advice)

