"""table-recover in words: its finding for the README, the sentence that reconciles it with
table-fixes', and the page's notes (the states, the superseded cells, the precise rows)."""

from __future__ import annotations

import math

import yaml

from bnlab.advice import said
from bnlab.claims.recover import cells
from bnlab.claims.recover.cells import (
    COMMUNICATION_FREE,
    FIRST,
    INPUTS,
    RULES,
    SHORT,
    WORDS,
    Recover,
    by_fix,
    measure,
    pct,
    picks,
    reference,
)
from bnlab.jitter import MIN_EVALS
from bnlab.lab import page, rules
from bnlab.lab.results import signed
from bnlab.lab.table import Finding, RunsData
from bnlab.paths import CONFIGS, EXPERIMENTS


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
    """What the precise rows read (rules versions 3 and 4): val/acc_precise, the evaluation
    just after each epoch end's recalibration, beside bn and the reference at the same epoch
    ends, with how many such evaluations their plateau holds, and why val/acc (what version 2
    read) measured BN instead: the evaluations where a precise run's val/acc equals its seed's
    bn run exactly."""
    same, total, few = 0, 0, set()
    for inp in INPUTS:
        p, b = by_fix(d, "precise", inp), by_fix(d, "bn", inp)
        for r in (p.runs if p and b else []):
            few.add(r.jitter(p.epochs, p.kind).get("n_evals"))
            twin = next((x for x in b.runs if x.seed == r.seed), None)
            if twin is None:
                continue
            acc = {row["step"]: row["val/acc"] for row in twin.rows if "val/acc" in row}
            mine = [(row["step"], row["val/acc"]) for row in r.rows if "val/acc" in row]
            same += sum(acc.get(s) == v for s, v in mine)
            total += len(mine)
    counts = sorted(x for x in few if x is not None)
    if not total or not counts:
        return []
    jitter_too = "" if min(counts) >= MIN_EVALS else \
        f": fewer than the {MIN_EVALS} jitter needs, so it is not shown for them"
    return [f"The precise rows read val/acc_precise, the evaluation just after each epoch "
            f"end's recalibration ({'/'.join(map(str, counts))} on each run's plateau"
            f"{jitter_too}), and their gap and gain read bn and the reference at the same "
            "epoch ends, so both sides sample the same points of a plateau on which accuracy "
            "still rises. Their val/acc, which every other row reads, is BN's by then: the "
            "running statistics' EMA has replaced what the recalibration set, and "
            f"{same} of their {total} val/acc evaluations equal their seed's bn run exactly. "
            "These readings are rules versions 3 and 4, written after the data were seen; "
            "what the earlier versions gave is under the rules below.", ""]


def precise_as(data: Recover, version: int) -> str | None:
    """What rules version `version` gave the precise rows (cells.read_as): per input, its gain
    over bn, its share and its state; None where no precise row is measured."""
    old = cells.read_as(data, version)
    said_ = []
    for inp in INPUTS:
        c = by_fix(old.runs, "precise", inp) if old.runs is not None else None
        m = None if c is None else measure(old.runs, c)
        if m is None:
            continue
        share = "" if not math.isfinite(m["share"][0]) else (
            f", share {signed(pct(m['share'][0]), 0, '')}% ({signed(pct(m['share'][1]), 0, '')}"
            f" to {signed(pct(m['share'][2]), 0, '')})")
        said_.append(f"on {inp}, gain over bn {signed(m['gain']['gap'])} ("
                     f"{signed(m['gain']['lo'], 1, '')} to {signed(m['gain']['hi'], 1, '')})"
                     f"{share}, {m['state']}")
    how = {2: "the precise rows read at val/acc",
           3: "the precise rows read at val/acc_precise beside bn and the reference at every "
              "evaluation of their plateau"}[version]
    return f"{how}: " + "; ".join(said_) if said_ else None


def read_as_ema(data: Recover) -> str | None:
    return precise_as(data, 2)


def read_as_v3(data: Recover) -> str | None:
    return precise_as(data, 3)


def states_in_words(by: rules.Rules = RULES, reference: str = "the 1 x 8 reference") -> str:
    """The states in plain words, with the two readings a reader trips on (the rules, as data,
    are below the page's table in rules.yaml; `reference`: what a fix's gap is against)."""
    return (f"States: **recovers**: the fix ends within {by['recovers_gap']:g} points of "
            f"{reference}, and its interval rules out losing {by['recovers_interval']:g} or "
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
            f"which is wider with {by['min_seeds']} seeds.")


def beside_others() -> str:
    """Where this table's answer sits beside the README's other GroupNorm numbers: table-fixes
    ran gn at its own rate and length, make demo trains this table's second input."""
    gn, here = fixes_gn(), float(reference("")[-1].split("=")[1])
    return (f"Beside the other tables: table-fixes (the README's finding 4) measured GroupNorm "
            f"({gn['groups']} groups) on resnet20 at lr {gn['lr']:g}, 1/{here / gn['lr']:g} of "
            f"the rate here, over {gn['epochs']} epochs "
            "with bn at that same rate; here each fix runs at the rate its own held-out pilot "
            "chose, over 10 epochs (table-converge trains them 4x longer), so the two rank "
            "GroupNorm on different protocols. `make demo` trains torchvision resnet18 at 32 "
            "px, this table's second input, where BN normalizes 2 values per channel per rank.")


def share_clause(name: str, e: dict, words: bool, verb: str = "gets back") -> str:
    """A fix's share of BN's loss with its interval beside it, then its state: 'SyncBN gets
    back 95% of BN's loss (95% CI 80 to 110), recovers' (`words`), else 'SyncBN 95% (80 to
    110), recovers' (an entry of advice.json's form, with its share and interval)."""
    pct, ci = f"{100 * e['share']:.0f}%", f"{100 * e['lo']:.0f} to {100 * e['hi']:.0f}"
    return (f"{name} {verb} {pct} of BN's loss (95% CI {ci}), {e['state']}" if words
            else f"{name} {pct} ({ci}), {e['state']}")


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
        else:
            parts.append(share_clause(e["name"], e, i == 0))
    free = [f for f in p["fixes"] if f in COMMUNICATION_FREE]
    if not better:
        tail = "no fix beats BN"
    elif free and all(p["fixes"][f]["state"] == "no better" for f in free):
        tail = "no fix without per-step communication beats BN"
    else:
        tail = (f"{', '.join(worse)} do{'es' * (len(worse) == 1)} no better than BN"
                if worse else "")
    return "; ".join(x for x in (page.listed(parts), tail) if x)


def best_two(p: dict, first: bool = True, short: dict[str, str] = SHORT) -> str:
    """One input's answer in a clause short enough to sit beside another's: its best fix with
    the share of BN's loss it gets back (`first`: in full words, else as a bare share), then
    the best without per-step communication, or that none beats BN (`short`: each fix's short
    name, by its spec name)."""
    def share(e: dict, words: bool) -> str:
        if e.get("share") is None or e.get("lo") is None:
            return said(e)
        return share_clause(short.get(e["fix"], e["name"]), e, words, "regains")

    best, free = p["best"], p.get("best_free")
    if best["state"] == "no better":
        return "no fix beats BN"
    if free is not None and free["fix"] == best["fix"]:
        return share(best, first)
    tail = ("none without cross-GPU communication does"
            if free is None or free["state"] == "no better" else
            f"communication-free {share(free, False)}")
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
            + (f" ({p['values']} values)" if p.get("values") else "")
            + f" {best_two(p, i == 0)}" for i, (inp, p) in enumerate(done.items()))
    return [Finding(text + ".", "recover", rules.mark(RULES), rank=2, after=reconciled(done)),
            *under_practice(done)]


def under_practice(done: dict[str, dict]) -> list[Finding]:
    """The line set under table-practice's finding 2 once it stands in for this table's (lab/
    table.nested keeps a finding that extends the replacing table, and drops it while that
    table has no finding): the answer on the input table-practice does not train, with this
    table's layout and the reference its share is against (the README's terms line then
    defines the share against 8 x 16 "unless said"; table-practice's page links the earlier
    protocol's other tables); none until that input is measured."""
    second = next((inp for inp in done if inp != FIRST), None)
    if second is None:
        return []
    text = f"On {WORDS.get(second, second)}, 4 x 2 against 1 x 8: {best_two(done[second])}."
    return [Finding(text, "recover", rules.mark(RULES), extends="practice")]


def reconciled(done: dict[str, dict] | None = None) -> str:
    """One story about GroupNorm in plain words: where this table puts plain GroupNorm on
    resnet20 (finding 4, table-fixes', says its own rate and length in its sentence), and that
    `make demo` trains this table's second input on its own shorter protocol (`done`: each
    measured input's picks)."""
    done = done or {}
    ours = done.get(FIRST, {}).get("fixes", {}).get("gn")
    first = ("" if ours is None else
             f"Plain GroupNorm on resnet20 {versus(ours)} in finding 2's table, which trains "
             "each fix 10 epochs at the rate its held-out pilot chose, not finding 4's "
             f"{finding_four()}.")
    second = next((inp for inp in done if inp != FIRST), None)
    g2 = None if second is None else done[second]["fixes"].get("gn")
    demo = "" if g2 is None else (
        f"`make demo` trains {WORDS.get(second, second)}, finding 2's second input, on a "
        f"shorter protocol of its own; for that input, plain GroupNorm in finding 2's table "
        f"{versus(g2)}.")
    return " ".join(x for x in (first, demo) if x)


def fixes_gn() -> dict:
    """table-fixes' GroupNorm cell (the README's finding 4): {epochs, lr, groups} from its
    spec (its protocol's length where the cell sets none; 32 groups where it sets none)."""
    raw = yaml.safe_load((EXPERIMENTS / "fixes" / "sweep.yaml").read_text())
    gn = next(c for c in raw["cells"] if c.get("fix") == "gn")
    said = dict(o.split("=", 1) for o in gn["overrides"] if "=" in o)
    epochs = int(said["epochs"]) if "epochs" in said else yaml.safe_load(
        (CONFIGS / "experiment" / f"{raw['experiment']}.yaml").read_text())["epochs"]
    return {"epochs": epochs, "lr": gn["lr"], "groups": said.get("norm.groups", "32")}


def finding_four() -> str:
    """How table-fixes (the README's finding 4) trains GroupNorm: '20 epochs at 1/16 of the
    default rate'."""
    gn = fixes_gn()
    return f"{gn['epochs']} epochs at 1/{float(reference('')[-1].split('=')[1]) / gn['lr']:g} " \
        "of the default rate"


def versus(e: dict, verb: str = "plateaus") -> str:
    """'plateaus 6.0 points below BN', 'plateaus 30.9 points above BN', 'plateaus level with
    BN': a fix's gain over bn, in words (`verb`: "ends" where a table reads end accuracy)."""
    gain = e["gain"]
    if abs(gain) < 0.05:
        return f"{verb} level with BN"
    return f"{verb} {abs(gain):.1f} points {'above' if gain > 0 else 'below'} BN"
