"""What bnlab measured about the fixes at the break, for the doctor's fix lines: read from
bnlab/measured/advice.json, inside the package (an installed wheel carries it), which `make
table-recover` writes from its runs, one entry per input once its cells have their seeds
(bnlab/claims/recover/); bnlab/measured/practice.json, which `make table-practice` writes
(every fix at its best at 8 ranks x 2, global batch 16, in the same form); and
bnlab/measured/converge.json, which `make table-converge` writes from its runs 4x longer on
one input. A line cites the measured input nearest to the user's model in values per channel
per rank at its smallest BN layer (table-practice's row first where it is as near as another,
by that table's rule `advice`), names it and its table, and says where another input, or the
longer runs, rank the fix differently. Nothing here types a result.
"""

from __future__ import annotations

import json
import math
import re

from bnlab.paths import MEASURED

ADVICE = MEASURED / "advice.json"
LONGER = MEASURED / "converge.json"  # one input trained 4x longer, as an advice.json input
PRACTICE = MEASURED / "practice.json"  # make table-practice: its 8 x 2 row and thresholds' answer
TABLE = "make table-recover: experiments/recover/table.md in bnlab's repository"
PRACTICE_SOURCE = "make table-practice: experiments/practice/table.md in bnlab's repository"
RECOVER, PRACTICE_TABLE = "table-recover", "table-practice"  # an entry's `table`
# no per-step communication (PreciseBN all-reduces once per recalibration), as table-recover
FREE = ("gn", "gnws", "ln", "evonorm", "brn", "precise", "frozen_bn")
FAR = 2.0  # log2: an input with over 4x more (or fewer) values per channel is said to be far
TIE = 0.5  # log2: two inputs whose distances to the model differ by less are about as near


def said(entry: dict) -> str:
    """'GroupNorm (gn) gets back 62% of BN's loss (95% CI 40 to 84): partly'; where it ends
    below bn, 'GroupNorm (gn) ends 4.1 points below BN (share of BN's loss recovered -45%, 95%
    CI -60 to -30): no better'; its state alone where it has no share."""
    fix = entry["fix"] if entry.get("name") is None else f"{entry['name']} ({entry['fix']})"
    if entry.get("identical"):  # table-converge: its runs are the reference's, value by value
        return f"{fix} gets back all of BN's loss (its runs equal the 1 x 8 reference's): " \
            f"{entry['state']}"
    if entry.get("share") is None:
        return f"{fix}: {entry['state']}"
    ci = "" if entry.get("lo") is None else \
        f"95% CI {100 * entry['lo']:.0f} to {100 * entry['hi']:.0f}"
    if entry["share"] < 0:
        return (f"{fix} ends {-entry['gain']:.1f} points below BN (share of BN's loss "
                f"recovered {100 * entry['share']:.0f}%{', ' + ci if ci else ''}): "
                f"{entry['state']}")
    return (f"{fix} gets back {100 * entry['share']:.0f}% of BN's loss"
            f"{f' ({ci})' if ci else ''}: {entry['state']}")


def verdict(entry: dict, brief: bool = False) -> str:
    """`said` in a few words, for a fix line's one sentence: 'gets back 69% of BN's loss,
    partly', 'ends 6.0 points below BN, no better'; `brief`, fewer still, for an input cited
    beside the first: '101%, recovers', '6.0 points below BN, no better'."""
    state = entry["state"]
    if entry.get("identical"):
        return f"all, {state}" if brief else f"gets back all of BN's loss, {state}"
    if entry.get("share") is None:
        return state
    if entry["share"] < 0:
        return f"{'' if brief else 'ends '}{-entry['gain']:.1f} points below BN, {state}"
    share = f"{100 * entry['share']:.0f}%"
    return f"{share}, {state}" if brief else f"gets back {share} of BN's loss, {state}"


EVIDENCE = "\n    "  # a fix line's evidence: each on an indented line under it
WORDS = 40  # a fix line's sentence, at most (its evidence on indented lines under it)


def read_json(path) -> dict | None:
    """A measured file's object; None where it is missing, unreadable or not an object."""
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def longer() -> dict | None:
    """converge.json's entry ({input, epochs, where, fixes}), or None where it is missing or
    unreadable."""
    got = read_json(LONGER)
    return got if got is not None and isinstance(got.get("fixes"), dict) and \
        got.get("epochs") else None


def lengths(entries: list[dict]) -> tuple[dict | None, dict | None]:
    """converge.json's entry and, among `entries`, table-recover's entry for the same input
    (its 10-epoch runs); (_, None) where either is missing."""
    long = longer()
    return long, next((e for e in entries if long and e.get("input") == long["input"]
                       and table_of(e) == RECOVER), None)


def at_length(entry: dict) -> str:
    """'on resnet20 trained 40 epochs'."""
    return f"on {entry['input']} trained {entry['epochs']} epochs"


def table_of(entry: dict) -> str:
    """The table an entry comes from: table-practice's row says so; advice.json's are
    table-recover's."""
    return entry.get("table", RECOVER)


def read() -> list[dict]:
    """Every measured entry ({input, values, where, best, best_free, fixes}): table-practice's
    row first, then advice.json's inputs; [] where both are missing or unreadable. A file of
    one input's entry (as written before entries were per input) reads as that input."""
    practice = read_json(PRACTICE) or {}
    first = [practice] if "where" in practice and isinstance(practice.get("fixes"), dict) \
        else []
    advice = read_json(ADVICE)
    if advice is None:
        return first
    if "inputs" in advice:
        return first + [e for e in advice["inputs"] if isinstance(e, dict) and "where" in e]
    return first + ([advice] if "where" in advice else [])


def nearest(entries: list[dict], values: int | None) -> tuple[dict, list[dict], list[dict]]:
    """(the entry cited first, those as near, the rest): the entry whose values per channel at
    the break are nearest to `values` (on a log scale: 2 is as far from 8 as 8 from 32), or
    table-practice's where it is as near (its rule `advice`); as near: within TIE of the
    nearest, whichever is cited first; the first entry where `values` or an entry's own is
    unknown."""
    closest = min(entries, key=lambda e: _distance(e, values)) if values else entries[0]
    near = [closest, *as_near([e for e in entries if e is not closest], closest, values)]
    best = next((e for e in near if table_of(e) == PRACTICE_TABLE), closest)
    return best, [e for e in near if e is not best], [e for e in entries if e not in near]


def _distance(e: dict, values: int | None) -> float:
    if not values or not e.get("values"):
        return math.inf
    return abs(math.log2(values) - math.log2(e["values"]))


def as_near(others: list[dict], here: dict, values: int | None) -> list[dict]:
    """The inputs among `others` about as near `values` as `here`, within TIE on the log
    scale, which a line cites beside it rather than picking one by list order."""
    d = _distance(here, values)
    return [o for o in others if math.isfinite(d) and abs(_distance(o, values) - d) < TIE]


def beside(here: dict, ties: list[dict], sentence: str, tie_head, room: int | None) -> str:
    """`sentence` with each other input as near named after it ('; as near, <input>: <its
    few words>'), where the sentence then keeps within `room` words (None: no bound); another
    table's row on `here`'s input is evidence only."""
    others = {_input(t)[1]: t for t in ties if _input(t)[1] != _input(here)[1]}.values()
    more = "".join(f"; as near, {short(t)}: {tie_head(t)}" for t in others)
    # a leading ';' joins the last word before it: not a word of its own
    fits = room is None or len((sentence + more).lstrip(";").split()) <= room
    return sentence + more if fits else sentence


def _nearest_said(here: dict, ties: list[dict], values: int | None, head, tie_head,
                  line, room: int | None) -> str:
    """A fix line's sentence (`head` of the nearest input, `tie_head` of each other input as
    near, within `room` words: beside) and its first evidence: the table at each of those
    inputs, `line` of each."""
    behind = any(_distance(t, values) < _distance(here, values) for t in ties)  # promoted
    return (beside(here, ties, f"{head(here)}, on {short(here)}", tie_head, room)
            + f"{EVIDENCE}{table_of(here)} at {cited(here, values, tie=behind)}: {line(here)}"
            + "".join(f"{EVIDENCE}{table_of(t)} at {cited(t, values, tie=True)}: {line(t)}"
                      for t in ties))


def cited(entry: dict, values: int | None, tie: bool = False) -> str:
    """'4 ranks x 2 on resnet20 (CIFAR-10; 128 values per channel per rank at its smallest BN
    layer, the measured input nearest to this model's 98)'; table-practice's row also gives its
    global batch and length ('CIFAR-10, global batch 16, 120 epochs; ...')."""
    if not entry.get("values"):
        return entry["where"]
    data = "CIFAR-10" + (f", global batch {entry['global_batch']}, {entry['epochs']} epochs"
                         if entry.get("global_batch") and entry.get("epochs") else "")
    why = f"{entry['values']} values per channel per rank at its smallest BN layer"
    if values:
        far = _distance(entry, values) > FAR
        why += (f" against this model's {values}: the nearest input measured, and far from it"
                if far and not tie else f", as near to this model's {values} as the other"
                if tie else f", the measured input nearest to this model's {values}")
    return entry["where"].replace("(CIFAR-10)", f"({data}; {why})")


def _input(entry: dict) -> tuple[str, str]:
    """(its layout, its input): ('4 x 2', 'resnet20') from '4 ranks x 2 on resnet20
    (CIFAR-10)'."""
    layout, _, name = entry["where"].rpartition(" on ")
    return layout.replace(" ranks", ""), name.replace(" (CIFAR-10)", "")


def short(entry: dict) -> str:
    """'resnet20 (128 values)': the input and its values per channel at the break; its layout
    too ('resnet20, 8 x 2 (128 values)') where another measured entry is on the same input."""
    layout, name = _input(entry)
    if layout and any(_input(e)[1] == name and _input(e)[0] != layout for e in read()):
        name += f", {layout}"
    return f"{name} ({entry['values']} values)" if entry.get("values") else name


def elsewhere(others: list[dict], differs, line) -> str:
    """An evidence line 'on resnet20 (128 values) it differs: ...' for each other input where
    `differs`."""
    return "".join(f"{EVIDENCE}on {short(o)} it differs: {line(o)}" for o in others
                   if differs(o))


def measured(fix: str, values: int | None = None, room: int | None = None) -> str:
    """What the tables measured for `fix` on the input nearest `values`, for the doctor's line
    on it: ': gets back 69% of BN's loss, partly, on resnet20 (128 values)' (its sentence
    within `room` words: beside), then the evidence, each on an indented line (the table at
    that input and each as near, any other input whose state for it differs, the longer
    runs); empty while none measured it."""
    entries = [e for e in read() if fix in e.get("fixes", {})]
    if not entries:
        return ""
    here, ties, rest = nearest(entries, values)
    state = here["fixes"][fix]["state"]

    def its(e: dict) -> str:
        return verdict(e["fixes"][fix])

    return (": " + _nearest_said(here, ties, values, its, its, lambda e: said(e["fixes"][fix]),
                                 room)
            + elsewhere(rest, lambda o: o["fixes"][fix]["state"] != state,
                        lambda o: said(o["fixes"][fix])) + lengthwise(fix, entries))


def _sync_key(entry: dict, samples: int) -> str | None:
    """The SyncBN cell of `entry` whose statistics groups hold `samples` images ('syncbn4' at 8
    ranks x 2 for 8; 'syncbn', over every rank, at 4 ranks x 2 for 8), or None."""
    layout = re.fullmatch(r"(\d+) x (\d+)", _input(entry)[0])
    if layout is None:
        return None
    world, per_rank = (int(n) for n in layout.groups())
    return next((k for k in entry.get("fixes", {}) if re.fullmatch(r"syncbn\d*", k)
                 and int(k[len("syncbn"):] or world) * per_rank == samples), None)


def synced(samples: int, values: int | None = None, room: int | None = None) -> str:
    """What the tables measured for SyncBN with `samples` images per statistics group, for the
    doctor's sync-group line: '; measured: gets back 68% of BN's loss, recovers, on resnet20,
    8 x 2 (128 values)' (the input nearest `values`), then the evidence on indented lines (each
    input as near, any other whose state differs, the longer runs); empty while no table
    measured SyncBN at that many images per group. Each other input as near is also named in
    the sentence where the sentence then keeps within `room` words (None: no bound)."""
    every = read()
    keys = {id(e): k for e in every if (k := _sync_key(e, samples))}
    entries = [e for e in every if id(e) in keys]
    if not entries:
        return ""
    fix = {id(e): e["fixes"][keys[id(e)]] for e in entries}
    here, ties, rest = nearest(entries, values)
    behind = any(_distance(t, values) < _distance(here, values) for t in ties)
    lines = [f"{table_of(e)} at {cited(e, values, tie=e is not here or behind)}: "
             f"{said(fix[id(e)])}" for e in (here, *ties)]
    lines += [f"on {short(o)} it differs: {said(fix[id(o)])}" for o in rest
              if fix[id(o)]["state"] != fix[id(here)]["state"]]
    # in the sentence: each other input as near (another table's row on the same input is
    # evidence only), its share and state in a few words, where they all fit
    head = beside(here, ties, f"; measured: {verdict(fix[id(here)])}, on {short(here)}",
                  lambda t: verdict(fix[id(t)], brief=True), room)
    return (head + "".join(EVIDENCE + line for line in lines)
            + lengthwise("syncbn", [e for e in entries if keys[id(e)] == "syncbn"]))


def lengthwise(fix: str, entries: list[dict]) -> str:
    """An evidence line 'on resnet20 trained 40 epochs it differs: ...' where the longer runs
    give `fix` another state than table-recover did on the same input; empty otherwise."""
    long, ten = lengths(entries)
    if ten is None or fix not in long["fixes"] or fix not in ten["fixes"] or \
            long["fixes"][fix]["state"] == ten["fixes"][fix]["state"]:
        return ""
    return (f"{EVIDENCE}{at_length(long)}, not 10 (where it was "
            f"{ten['fixes'][fix]['state']}), it differs: {said(long['fixes'][fix])}")


def groups(fix: str, values: int | None = None) -> tuple[int | None, str]:
    """(the group count the nearest measured input ran `fix` at (its pilot's choice), the table
    that ran it), or (None, "") where none is measured or the entry names none."""
    entries = [e for e in read() if fix in e.get("fixes", {})]
    if not entries:
        return None, ""
    here = nearest(entries, values)[0]
    return here["fixes"][fix].get("groups"), table_of(here)


def _free_line(entry: dict) -> str:
    free = entry["best_free"]
    return (f"none did better than BN; the closest, {said(free)}"
            if free["state"] == "no better" else said(free))


def _free_head(entry: dict) -> str:
    """'GroupNorm + Weight Standardization (gnws) gets back 69% of BN's loss, partly', or
    'none did better than BN'."""
    free = entry["best_free"]
    if free["state"] == "no better":
        return "none did better than BN"
    name = free["fix"] if free.get("name") is None else f"{free['name']} ({free['fix']})"
    return f"{name} {verdict(free)}"


def _tie_head(t: dict, here: dict) -> str:
    """An as-near input's best fix without communication, the fix's name left out where it is
    `here`'s too (the line stays one sentence of at most 40 words)."""
    same = t["best_free"]["fix"] == here["best_free"]["fix"] and \
        "no better" not in (t["best_free"]["state"], here["best_free"]["state"])
    return verdict(t["best_free"]) if same else _free_head(t)


def without_communication(options: str = "the lines below are options",
                          values: int | None = None, room: int | None = WORDS) -> str:
    """The doctor's line on fixes with no per-step communication (PreciseBN's all-reduce comes
    once per recalibration): the best one table-recover measured at 4 ranks x 2 on the input
    nearest `values` (or that none did better than BN there), in one sentence, then the
    evidence on indented lines (that input, any input that ranks them differently, the longer
    runs, the table); or that it has not been measured yet, and where the options are
    (`options`: the doctor's lines below them; bnlab.diagnose names the doctor). Its sentence
    keeps within `room` words, its opening words counted (beside)."""
    entries = [e for e in read() if e.get("best_free")]
    if not entries:
        return ("without per-step communication: which fix recovers most at the break has not "
                f"been measured yet ({TABLE}); {options}, not yet ranked at the break")
    here, ties, rest = nearest(entries, values)

    def differs(o: dict) -> bool:
        return (o["best_free"]["fix"], o["best_free"]["state"] == "no better") != \
            (here["best_free"]["fix"], here["best_free"]["state"] == "no better")

    opening = "without per-step communication: "
    return (opening
            + _nearest_said(here, ties, values, _free_head, lambda t: _tie_head(t, here),
                            _free_line, None if room is None else room - len(opening.split()))
            + elsewhere(rest, differs, _free_line) + free_lengthwise(entries)
            + f"{EVIDENCE}({'; '.join(sources([here, *ties, *filter(differs, rest)]))})")


def sources(entries: list[dict]) -> list[str]:
    """Where each cited entry's table lives, once each, in the order cited."""
    homes = {PRACTICE_TABLE: PRACTICE_SOURCE, RECOVER: TABLE}
    return list(dict.fromkeys(homes[table_of(e)] for e in entries))


def free_lengthwise(entries: list[dict]) -> str:
    """'; on resnet20 trained 40 epochs it differs: ...' where, among the fixes without per-step
    communication that both lengths trained, the longer runs' best is another fix, or beats BN
    where the shorter's did not (or the reverse); empty otherwise."""
    long, ten = lengths(entries)
    if ten is None:
        return ""
    free = [f for f in long["fixes"] if f in ten["fixes"] and f in FREE]
    if not free:
        return ""
    best = {n: max((e["fixes"][f] for f in free), key=lambda x: x["gain"])
            for n, e in (("ten", ten), ("long", long))}
    if (best["ten"]["fix"], best["ten"]["state"] == "no better") == \
            (best["long"]["fix"], best["long"]["state"] == "no better"):
        return ""
    return (f"{EVIDENCE}{at_length(long)}, not 10, the best of the fixes it trained without "
            f"communication ({', '.join(free)}) differs: "
            f"{_free_line({'best_free': best['long']})}")
