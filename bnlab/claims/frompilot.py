"""The sweep specs written from table-recoverpilot's choices: table-recover's
(experiments/recover/sweep.yaml, `python -m bnlab.claims recover-spec`) and, from the same
cells, table-converge's (bnlab/claims/converge.py). No table of its own.

A spec is written once every fix is chosen. Where the pilot later chooses a fix again (its
rules' `changed`: a new setting, or a new fix), the spec grows: the fix's old cells stay as
measured under a name that says their setting (gn at 32 groups becomes gn32, marked
`superseded`), and the fix gains new cells at its new setting, 5 seeds on both inputs, run
after every old cell. Any other difference from the committed spec is refused: a change after
runs is a rule change, made by hand and disclosed.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bnlab.claims import recover, recoverpilot
from bnlab.errors import BnlabError
from bnlab.lab import choose, table

PILOT_ONLY = ("data.holdout=", "eval_every=", "record.predictions=")  # the pilot's, not ours
HEADER = [
    "make table-recover: every fix at 4 ranks x 2 on resnet20 and resnet18 at 32 px, at the",
    "rate (and setting) resnet20's pilot chose on held-out data (experiments/recoverpilot;",
    "written from its choices by `python -m bnlab.claims recover-spec`), against each",
    "input's 1 x 8 reference and bn 4 x 2 (table-values' runs, the same overrides), on",
    "table-values' 10-epoch protocol, 5 seeds. Run order: resnet20's cells first (its",
    "ranking writes the doctor's advice and the README's finding), then resnet18's."]
GROWN = [
    "",
    "Grown by the pilot's rules version 2 (`changed`, experiments/recoverpilot/rules.yaml):",
    "where the pilot chose a fix again at a new setting, its old cells stay as measured under",
    "a name with their setting (`superseded`), and new cells at the new setting (and any new",
    "fix) follow every old cell, 5 seeds on both inputs."]


def pilot_picks(data: str | None = None) -> dict[str, dict]:
    """table-recoverpilot's choices from its committed runs."""
    d = table.runs_data(table.Context(recoverpilot.TABLE, data=data))
    return choose.choices(d.cells, choose.Rules.read(recoverpilot.RULES))


def settings() -> tuple[dict[str, dict], dict[str, tuple[str, list]]]:
    """The pilot's spec cells by label, and its rules' setting per fix (for grown())."""
    raw = yaml.safe_load(recoverpilot.TABLE.spec_path.read_text())
    return {c["label"]: c for c in raw["cells"]}, choose.Rules.read(recoverpilot.RULES).prefer


def spec_cells(picks: dict[str, dict]) -> list[dict]:
    """The final cells: the 1 x 8 reference, bn at 4 x 2, and each fix at its chosen cell's
    overrides less the pilot's held-out split, labelled as the pilot labels it; a BnlabError
    while any choice is not made."""
    open_ = [f"{fix} ({p['state']})" for fix, p in picks.items() if p["state"] != "chosen"]
    if open_:
        raise BnlabError(f"the pilot has not chosen every fix yet: {', '.join(open_)}; run "
                         "`make table-recoverpilot` until each is chosen (or add the rate its "
                         "edge rule asks for).")
    first = recover.INPUTS[recover.FIRST]
    cells = []
    for order, (name, model) in enumerate(recover.INPUTS.items()):  # the first input first
        cells += [{"label": f"{name}: bn 1x8 (reference)", "input": name, "fix": "reference",
                   "order": order, "overrides": recover.reference(model)},
                  {"label": f"{name}: bn 4x2", "input": name, "fix": "bn", "order": order,
                   "overrides": recover.bn_at_the_break(model)}]
        for fix, p in picks.items():
            c = p["cell"]
            over = [model if o == first else o for o in c.cell.overrides
                    if not o.startswith(PILOT_ONLY)]
            cells.append({"label": f"{name}: {c.cell.label}", "input": name, "fix": fix,
                          "lr": c.cell.meta["lr"], "pilot": c.cell.label, "order": order,
                          "overrides": over})
    return cells


def grown(old: list[dict], new: list[dict], pilot: dict[str, dict],
          prefer: dict[str, tuple[str, list]]) -> tuple[list[dict], list[str]]:
    """The committed spec's cells grown by the pilot's new choices (the module's docstring),
    and what changed in words. `pilot`: the pilot's spec cells by label; `prefer`: its rules'
    setting per fix. A BnlabError where a fix changed otherwise than in its setting."""
    have = {(c["input"], c["fix"]): i for i, c in enumerate(old)}
    out, said = [dict(c) for c in old], []
    after = max((c.get("order", 0) for c in old), default=-1) + 1
    inputs = list(recover.INPUTS)
    for c in new:
        i = have.get((c["input"], c["fix"]))
        if i is not None and out[i]["overrides"] == c["overrides"]:
            continue
        if i is not None:
            was = out[i]
            key = prefer.get(c["fix"], (None,))[0]
            then, now = (pilot.get(x.get("pilot"), {}).get(key) for x in (was, c))
            if key is None or then is None or then == now:
                raise BnlabError(
                    f"{c['fix']} on {c['input']} changed otherwise than in its setting ("
                    f"{was['label']} -> {c['label']}); a change of the spec after its runs is "
                    "a rule change: make it by hand and disclose it in "
                    "experiments/recover/rules.yaml.")
            out[i] = {**was, "fix": f"{c['fix']}{then}",
                      "label": f"{c['input']}: {c['fix']} {then} {key} lr {was['lr']:g} "
                               "(superseded)",
                      "name": f"{recover.NAMES.get(c['fix'], c['fix'])}, {then} {key}",
                      "of": c["fix"],
                      "superseded": f"the pilot chose {now} {key} (its rules version 2)"}
            said.append(f"{was['label']} -> {out[i]['label']}")
        out.append({**c, "order": after + inputs.index(c["input"]),
                    "added": "when the pilot chose again (its rules version 2, `changed`)"})
        said.append(f"new: {c['label']}")
    return out, said


def write_from_pilot(path: Path, header: list[str], spec: dict, rules_name: str,
                     grows: bool = False) -> int:
    """A spec written from the pilot's choices: `header` (comment lines) and `spec`; refuses to
    overwrite one that differs unless `grows` (grown() made it from the committed spec)."""
    text = "\n".join([*(f"# {line}" for line in header),
                      yaml.safe_dump(spec, sort_keys=False, width=100)])
    if path.is_file() and path.read_text() != text and not grows:
        raise BnlabError(f"{path} exists and differs from what the pilot's choices give; a "
                         "change of the spec after its runs is a rule change: make it by hand "
                         f"and disclose it in experiments/{rules_name}/rules.yaml.")
    path.write_text(text)
    print(f"wrote {path}")
    return 0


def write_spec(path: Path = recover.SPEC, data: str | None = None) -> int:
    """experiments/recover/sweep.yaml from the committed pilot's runs, grown where it exists."""
    cells, said = spec_cells(pilot_picks(data)), []
    if path.is_file():
        cells, said = grown(yaml.safe_load(path.read_text())["cells"], cells, *settings())
        for line in said:
            print(line)
    return write_from_pilot(path, HEADER + (GROWN if said or "superseded" in str(cells) else []),
                            {"title": "What to use instead of BN at 4 ranks x 2: every fix at "
                             "its own held-out rate", "experiment": "headline",
                             "seeds": recover.SEEDS, "jobs": 2, "cells": cells},
                            "recover", grows=bool(said))
