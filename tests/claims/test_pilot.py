"""The pilot's rules (experiments/pilot): the best plateau accuracy on held-out data, ties
within a point to the stated side, diverged candidates out, nothing chosen while seeds lack."""

from __future__ import annotations

import json

import pytest
import yaml

from bnlab.claims import lr, pilot
from bnlab.lab.plan import Cell, Spec
from bnlab.lab.results import CellResult, Run
from bnlab.lab.table import RunsData
from bnlab.rundir import set_status

EPOCHS = 20


def fake_run(d, plateau_acc: float, status: str = "completed") -> Run:
    """A finished pilot run: 4 evaluations an epoch on the plateau at this accuracy (+-0.5)."""
    d.mkdir(parents=True)
    rows = [{"step": e, "epoch": e, "val/acc": 30.0, "val/loss": 2.0} for e in range(1, 11)]
    acc = 10.0 if plateau_acc is None else plateau_acc
    rows += [{"step": 100 + i, "epoch": 10 + (i + 1) / 4, "val/acc": acc + (-1) ** i / 2,
              "val/loss": 1.0} for i in range(40)]
    rows.append({"step": 999, "epoch": EPOCHS, "train/loss": 1.0, "train_epoch/loss": 1.0})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "run.json").write_text(json.dumps({"commit": "abc", "host": "h", "device": "cpu"}))
    (d / "config.yaml").write_text(yaml.safe_dump({"data": {"holdout": 1000}}))
    set_status(d, status)
    return Run.read(d)


def data(tmp_path, choice: str, key: str, accs: dict[float, list], seeds: int = 2) -> RunsData:
    cells = []
    for value, per_seed in accs.items():
        cell = Cell(f"{choice} {value:g}", [], list(range(seeds)), cfg={"epochs": EPOCHS},
                    meta={"choice": choice, key: value})
        runs = [fake_run(tmp_path / f"{choice}{value:g}" / f"seed{s}", a,
                         "diverged" if a is None else "completed")
                for s, a in enumerate(per_seed)]
        cells.append(CellResult(cell, runs, seeds))
    spec = Spec("pilot", "Pilot", "headline", [c.cell for c in cells], tmp_path / "sweep.yaml")
    return RunsData(spec, cells, "cifar10-5085", tmp_path, tmp_path / "out")


def test_the_best_rate_wins_and_a_tie_within_a_point_goes_to_the_smaller_rate(tmp_path):
    d = data(tmp_path / "a", "lr", "lr", {0.00625: [50, 52], 0.0125: [61, 61], 0.025: [62, 61.5]})
    pick = pilot.choose(d, "lr")
    assert pick["value"] == 0.0125  # 61 is within 1 point of 61.75: the smaller rate
    assert pick["score"] == pytest.approx(61)
    d = data(tmp_path / "b", "lr", "lr", {0.0125: [58, 59], 0.025: [62, 61.5]})
    assert pilot.choose(d, "lr")["value"] == 0.025  # 3 points apart: no tie


def test_a_candidate_that_diverged_in_a_seed_is_out(tmp_path):
    d = data(tmp_path, "lr", "lr", {0.0125: [58, 59], 0.1: [70, None]})
    pick = pilot.choose(d, "lr")
    assert pick["value"] == 0.0125 and "diverged in a seed, not candidates: 0.1" in pick["why"]


def test_groups_tie_to_the_most_and_the_freeze_to_the_earliest(tmp_path):
    d = data(tmp_path / "g", "groups", "groups", {2: [60, 60], 4: [60.2, 60.4], 8: [59.8, 59.5]})
    assert pilot.choose(d, "groups")["value"] == 8
    d = data(tmp_path / "f", "freeze", "freeze_after", {2: [55, 55.5], 5: [56, 56], 10: [57, 57]})
    assert pilot.choose(d, "freeze")["value"] == 5  # 2 is 1.25 points behind 10; 5 is tied


def test_nothing_is_chosen_while_a_candidate_lacks_seeds(tmp_path):
    d = data(tmp_path, "lr", "lr", {0.0125: [58, 59], 0.025: [62]})
    assert pilot.choose(d, "lr")["value"] is None
    text = pilot.render(d)
    assert "**Chosen: -**" in text and "held out" in text


def test_the_settled_sweeps_use_what_the_pilot_chose_from_the_committed_runs():
    """experiments/lr, values and the pilot's own second stage run at the rate the pilot's rule
    picks from its committed runs, fixes where their spec's rule puts them; fixes' gn and
    frozen BN use its other picks."""
    from bnlab.lab.results import collect
    from bnlab.lab.spec import load_spec
    from bnlab.paths import EXPERIMENTS

    spec = load_spec(EXPERIMENTS / "pilot" / "sweep.yaml")
    d = RunsData(spec, collect(spec, "cifar10-5085"), "cifar10-5085", None, None)
    rate = pilot.choose(d, "lr")["value"]
    assert rate is not None  # the pilot's runs are committed

    def rates(name: str) -> list[float]:
        raw = yaml.safe_load((EXPERIMENTS / name / "sweep.yaml").read_text())
        return [float(dict(o.split("=", 1) for o in c["overrides"])["optim.lr"])
                for c in raw["cells"] if c.get("choice", "") != "lr"]

    assert yaml.safe_load((EXPERIMENTS / "lr" / "sweep.yaml").read_text())["chosen_lr"] == rate
    assert rate in rates("lr")
    assert set(rates("values")) == set(rates("pilot")) == {rate}
    # the fixes run at one of table-lr's rates; their own cells are held (no seeds) until C1's
    # rate is settled, then run at it (the chosen rate where no rate is steady): their rule
    (fix_rate,) = set(rates("fixes"))
    assert fix_rate in rates("lr")
    lspec = load_spec(EXPERIMENTS / "lr" / "sweep.yaml")
    settled = lr.settled_rate(RunsData(lspec, collect(lspec, "cifar10-5085"), "", None, None))
    own = [c for c in load_spec(EXPERIMENTS / "fixes" / "sweep.yaml").cells
           if c.meta["fix"] not in ("bn", "syncbn")]
    if any(c.seeds for c in own):
        assert settled is not None, "the fixes got seeds before C1's rate was settled"
        assert fix_rate == settled
        steady = lr.ruling_rate(RunsData(lspec, collect(lspec, "cifar10-5085"), "", None,
                                         None))[0] is not None
        # with no steady rate only PreciseBN runs (C6 and C9 would be untestable for sure)
        assert all(bool(c.seeds) == (steady or c.meta["fix"] == "precise") for c in own)
    fixes = yaml.safe_load((EXPERIMENTS / "fixes" / "sweep.yaml").read_text())["cells"]
    for choice, fix, key in (("groups", "gn", "norm.groups"),
                             ("freeze", "frozen_bn", "norm.freeze_after")):
        pick = pilot.choose(d, choice)["value"]
        cell = next((c for c in fixes if c["fix"] == fix), None)
        if cell is not None:  # added once the pilot has chosen
            assert pick is not None
            assert float(dict(o.split("=", 1) for o in cell["overrides"])[key]) == pick


def test_every_values_input_has_one_reference_and_two_levels_meet_from_different_images():
    """table-values reads each cell against its input's 1 x 8 cell, and separates samples
    from values only where two cells that are not references reach one level."""
    from bnlab.lab.spec import load_spec
    from bnlab.paths import EXPERIMENTS

    cells = load_spec(EXPERIMENTS / "values" / "sweep.yaml").cells
    blocks = {(c.meta["input"], c.meta.get("batch", 8)) for c in cells}
    assert {b for _, b in blocks} == {8, 16}  # rule v5 adds global batch 16
    assert all(sum(c.meta["per_rank"] == b for c in cells
                   if (c.meta["input"], c.meta.get("batch", 8)) == (i, b)) == 1
               for i, b in blocks)
    area = {"resnet18 32 px": 1, "resnet18 64 px": 4, "resnet20": 64}  # smallest BN map
    level = {}
    for c in cells:
        if c.meta["per_rank"] != 8 and c.meta.get("batch", 8) == 8:
            level.setdefault(c.meta["per_rank"] * area[c.meta["input"]], set()).add(
                c.meta["per_rank"])
    assert any(len(images) > 1 for images in level.values()), level
