"""The pilot's choice rule as data (bnlab.lab.choose) on runs made up for the case: best score,
ties to the preferred setting then the smallest rate, the ladder's edge, waiting, divergence."""

from __future__ import annotations

from pathlib import Path

import pytest

from bnlab.claims import recoverpilot
from bnlab.lab import choose
from bnlab.lab.plan import Cell
from bnlab.lab.results import CellResult
from bnlab.rundir import set_status
from conftest import fake_headline_run

RULES = choose.Rules(1.0, {"brn": ("ramp", ["paper", "run"])}, [{"version": 1}], {})


def cell(tmp: Path, fix: str, lr: float, accs: list[float] | None, seeds: int = 2,
         diverge: bool = False, **meta) -> CellResult:
    """A pilot cell whose seeds plateau at these accuracies (None: none has run)."""
    label = f"{fix} lr {lr:g} {meta}"
    runs = []
    for s, a in enumerate(accs or []):
        d = tmp / label / f"seed{s}"
        run = fake_headline_run(d, [a] * 100, epochs=10, seed=s)
        if diverge and s == 0:
            set_status(d, "diverged")
            run.status = "diverged"
        runs.append(run)
    c = Cell(label, [], list(range(seeds)), cfg={"epochs": 10}, meta={"fix": fix, "lr": lr,
                                                                       **meta})
    return CellResult(c, runs, seeds)


def test_the_best_cell_wins_and_a_tie_goes_to_the_smaller_rate(tmp_path):
    cells = [cell(tmp_path, "gn", lr, a) for lr, a in ((0.001, [50, 50]), (0.004, [60, 60]),
                                                       (0.016, [60.5, 60.5]), (0.064, [40, 40]))]
    pick = choose.choose(cells, RULES)
    assert pick["state"] == "chosen" and pick["cell"] is cells[1]  # 60 is within 1 of 60.5
    assert "best 60.5%" in pick["why"]


def test_a_tie_goes_to_the_preferred_setting_before_the_rate(tmp_path):
    cells = [cell(tmp_path, "brn", 0.001, [50, 50], ramp="run"),
             cell(tmp_path, "brn", 0.004, [61, 61], ramp="run"),
             cell(tmp_path, "brn", 0.016, [55, 55], ramp="run"),
             cell(tmp_path, "brn", 0.001, [30, 30], ramp="paper"),
             cell(tmp_path, "brn", 0.004, [60.2, 60.2], ramp="paper"),
             cell(tmp_path, "brn", 0.016, [40, 40], ramp="paper")]
    assert choose.choose(cells, RULES)["cell"] is cells[4]
    cells[4] = cell(tmp_path / "b", "brn", 0.004, [59.9, 59.9], ramp="paper")  # out of the tie
    assert choose.choose(cells, RULES)["cell"] is cells[1]


def test_a_choice_on_the_ladders_edge_asks_for_one_rate_more_once(tmp_path):
    cells = [cell(tmp_path, "ln", lr, a) for lr, a in ((0.001, [50, 50]), (0.004, [55, 55]),
                                                       (0.016, [62, 62]))]
    pick = choose.choose(cells, RULES)
    assert pick["state"] == "needs a rate" and pick["edge"] == pytest.approx(0.064)
    cells.append(cell(tmp_path, "ln", 0.064, [64, 64], edge=True))
    pick = choose.choose(cells, RULES)
    assert pick["state"] == "chosen" and pick["cell"] is cells[-1]  # on the edge again: once
    assert "still on its ladder's edge after the rate the rule added" in pick["why"]
    assert pick["beyond"] == pytest.approx(0.256)  # the next rate out, for the page that uses it


def test_the_rule_waits_for_every_seed_and_drops_a_diverged_cell(tmp_path):
    cells = [cell(tmp_path, "syncbn", 0.001, [50, 50]), cell(tmp_path, "syncbn", 0.004, [60]),
             cell(tmp_path, "syncbn", 0.016, [55, 55])]
    assert choose.choose(cells, RULES)["state"] == "undecided"
    cells[1] = cell(tmp_path / "b", "syncbn", 0.004, [70, 70], diverge=True)
    pick = choose.choose(cells, RULES)
    assert pick["cell"] is cells[2] and "diverged in a seed" in pick["why"]
    gone = [cell(tmp_path / "c", "ln", lr, [50, 50], diverge=True) for lr in (0.001, 0.004)]
    assert choose.choose(gone, RULES)["state"] == "no candidate"


def test_the_committed_rules_read_and_name_every_fix_with_a_setting_in_the_spec():
    import yaml

    rules = choose.Rules.read(recoverpilot.RULES)
    spec = yaml.safe_load((recoverpilot.RULES.parent / "sweep.yaml").read_text())
    with_setting = {c["fix"] for c in spec["cells"]  # `edge`: the edge rule's mark, no setting
                    if set(c) - {"label", "fix", "lr", "overrides", "edge"}}
    assert all(c.get("edge", True) is True for c in spec["cells"])
    assert with_setting == set(rules.prefer)
    for c in spec["cells"]:  # every setting value of the spec is one the rule orders
        if c["fix"] in rules.prefer:
            key, order = rules.prefer[c["fix"]]
            assert c[key] in order
    assert rules.tie == 1.0 and rules.versions[0]["written"] == "before any pilot run"
