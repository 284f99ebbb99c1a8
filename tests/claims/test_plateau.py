"""The headline protocol's tables (plateau, decompose, lrpilot): their rules on runs with chosen
curves, and their sweeps' learning rate against the pilot's choice."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from bnlab.claims import decompose, lrpilot, plateau
from bnlab.lab.plan import Cell, Spec
from bnlab.lab.results import CellResult, Run, collect, split
from bnlab.lab.spec import load_spec
from bnlab.lab.table import RunsData
from bnlab.paths import EXPERIMENTS
from bnlab.rundir import set_status
from conftest import fake_headline_run

TAG = "cifar10-5085"  # the committed runs' data tag
EPOCHS = 20


def curve(seed: int, noise: float) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(np.clip(40 + 0.5 * np.arange(200) / 10 + rng.normal(0, noise, 200), 0, 100))


def data(tmp_path, noise: dict[str, float], seeds: int = 5) -> RunsData:
    cells = []
    for model in plateau.MODELS:
        for norm in plateau.NORMS:
            runs = []
            for s in range(seeds):
                d = tmp_path / model / norm / f"seed{s}"
                fake_headline_run(d, curve(100 * s + len(cells), noise[norm]))
                runs.append(Run.read(d, s))
            cell = Cell(f"{model} {norm}", [], list(range(seeds)),
                        cfg={"epochs": EPOCHS, "optim": {"lr": 0.1}},
                        meta={"model": model, "norm": norm})
            cells.append(CellResult(cell, runs, seeds))
    spec = Spec("plateau", "Headline", "plateau", [c.cell for c in cells], tmp_path)
    return RunsData(spec, cells, "t", tmp_path, tmp_path)




def test_the_history_table_renders_without_verdicts(tmp_path):
    d = data(tmp_path, {"bn": 4.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0}, seeds=2)
    assert plateau.verdicts(d) == [] and plateau.TABLE.claims == ()
    md = plateau.render(d)
    assert "## resnet20, 4 ranks x 2 images, lr 0.1 constant" in md
    assert "| resnet18 bn | 2 |" in md and "on 1000 test images" in md
    plateau.plot(d, tmp_path / "plateau.png")
    assert (tmp_path / "plateau.png").stat().st_size > 10_000


def test_decompose_splits_the_running_statistics_from_the_weights(tmp_path):
    rng = np.random.default_rng(0)
    weights = list(40 + 0.05 * np.arange(200) + rng.normal(0, 1, 200))
    ema = [w + rng.normal(0, 3) for w in weights]  # the statistics add noise of sd 3
    d = tmp_path / "r"
    fake_headline_run(d, ema, decomp=weights, batch=True)
    run = Run.read(d, 0)
    s = split(run, EPOCHS)
    assert s["statistics"] == pytest.approx(9, rel=0.35) and s["weights"] == pytest.approx(
        1, rel=0.35)
    cell = CellResult(Cell("resnet20 bn", [], [0], cfg={"epochs": EPOCHS}), [run], 1)
    text = decompose.findings(RunsData(None, [cell], "t", tmp_path, tmp_path))
    shares = [s[k] / s["total"] * 100 for k in ("statistics", "weights", "covariance")]
    assert sum(shares) == pytest.approx(100)  # the three parts add up to the whole
    assert (f"statistics' part is {shares[0]:.0f}%, the weights' {shares[1]:.0f}% and twice "
            f"their covariance {shares[2]:+.0f}%") in text


def pilot_run(tmp_path, name, losses, acc, status="completed"):
    d = tmp_path / name
    d.mkdir()
    rows = [{"step": i, "epoch": i + 1, "train_epoch/loss": x} for i, x in enumerate(losses)]
    rows.append({"step": 9, "epoch": 5, "val/acc": acc, "train/loss": losses[-1]})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    set_status(d, status)
    return Run.read(d, 0)


def test_pilot_rule_takes_the_largest_stable_rate(tmp_path):
    runs = {0.0125: pilot_run(tmp_path, "a", [2.1, 1.9, 1.7], 40.0),
            0.025: pilot_run(tmp_path, "b", [2.1, 1.8, 1.6], 45.0),
            0.05: pilot_run(tmp_path, "c", [2.1, 1.7, 1.8], 44.0),     # loss rose at the end
            0.1: pilot_run(tmp_path, "d", [2.3, 2.3, 2.2], 12.0)}      # does not learn
    assert [lrpilot.stable(r)[0] for r in runs.values()] == [True, True, False, False]
    cells = [CellResult(Cell(f"lr {lr}", [], [0], meta={"model": "m", "lr": lr}), [r], 1)
             for lr, r in runs.items()]
    pick = lrpilot.choice(RunsData(None, cells, "t", tmp_path, tmp_path))
    assert pick["m"]["lr"] == 0.025


def test_the_headline_sweeps_use_the_rate_the_pilot_chose():
    spec = load_spec(EXPERIMENTS / "lrpilot" / "sweep.yaml")
    pilot = lrpilot.choice(RunsData(spec, collect(spec, TAG), TAG, None, None))
    for name in ("plateau", "decompose"):
        raw = yaml.safe_load((EXPERIMENTS / name / "sweep.yaml").read_text())
        for c in raw["cells"]:
            ov = dict(o.split("=", 1) for o in c["overrides"])
            which = lrpilot.group({"model": ov["model"], "optim": ov.get("optim", "sgd")})
            assert pilot[which]["lr"] == float(ov["optim.lr"]), (name, c["label"])
