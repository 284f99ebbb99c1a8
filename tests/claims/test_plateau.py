"""The headline protocol's tables (plateau, decompose, lrpilot): their rules on runs with chosen
curves, and their sweeps' learning rate against the pilot's choice."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from bnlab.claims import decompose, lrpilot, plateau
from bnlab.lab.results import CellResult, Run, collect
from bnlab.lab.sweep import Cell, Spec, load_spec
from bnlab.lab.table import RunsData
from bnlab.metrics import PREDICTIONS, encode_classes
from bnlab.paths import EXPERIMENTS
from bnlab.rundir import set_status

TAG = "cifar10-5085"  # the committed runs' data tag
N = 1000  # test images of the fake runs
EPOCHS = 20


def fake_run(d, accs, decomp: list[float] | None = None):
    """A finished headline-protocol run: 10 evaluations per epoch with these val accs, and
    predictions in which the first acc% of the images are right (class 0 of label 0)."""
    d.mkdir(parents=True)
    rows, preds = [], [json.dumps({"step": 0, "labels": encode_classes(np.zeros(N))})]
    for i, a in enumerate(accs):
        ep = (i + 1) / 10
        row = {"step": i + 1, "epoch": ep, "val/acc": a, "val/loss": 2.0 - a / 100}
        if decomp is not None:
            row.update({"decomp/acc_precise": decomp[i], "decomp/loss_precise": 1.0,
                        "decomp/acc_batch": 10.0, "decomp/loss_batch": 2.3})
        rows.append(row)
        cls = (np.arange(N) >= round(a * N / 100)).astype(np.uint8)
        for kind in ("ema", *(("precise", "batch") if decomp is not None else ())):
            preds.append(json.dumps({"step": i + 1, "epoch": ep, "kind": kind,
                                     "pred": encode_classes(cls)}))
    rows.append({"step": 999, "epoch": EPOCHS, "train/loss": 1.0, "train_epoch/loss": 1.0})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / PREDICTIONS).write_text("\n".join(preds) + "\n")
    (d / "run.json").write_text(json.dumps({"commit": "abc", "host": "h", "device": "cpu"}))
    set_status(d, "completed")


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
                fake_run(d, curve(100 * s + len(cells), noise[norm]))
                runs.append(Run.read(d, s))
            cell = Cell(f"{model} {norm}", [], list(range(seeds)),
                        cfg={"epochs": EPOCHS, "optim": {"lr": 0.1}},
                        meta={"model": model, "norm": norm})
            cells.append(CellResult(cell, runs, seeds))
    spec = Spec("plateau", "Headline", "plateau", [c.cell for c in cells], tmp_path)
    return RunsData(spec, cells, "t", tmp_path, tmp_path)


def test_c1_c6_c9_reproduced_where_bn_jitters_far_above_the_others(tmp_path):
    d = data(tmp_path, {"bn": 4.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0})
    c1, c6, c9 = plateau.c1(d), plateau.c6(d), plateau.c9(d)
    assert c1.verdict == "reproduced", c1
    assert "resnet20 reproduced, resnet18 reproduced" in c1.why
    assert c6.verdict == "reproduced" and c9.verdict == "reproduced"
    bn = plateau.cell(d, "resnet20", "bn")
    assert 3.5 < np.mean(plateau.vals(bn)) < 4.5  # the von Neumann sd recovers the noise
    assert np.mean(plateau.vals(bn, "swing")) > 8  # the range over 100 evaluations is wider


def test_c1_is_indistinguishable_when_the_seeds_overlap(tmp_path):
    d = data(tmp_path, {"bn": 1.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0})
    c1, c6 = plateau.c1(d), plateau.c6(d)
    assert c1.verdict == "not reproduced" and "(indistinguishable)" in c1.ours
    assert c6.verdict == "not reproduced"


def test_rules_wait_for_three_seeds_and_the_table_renders(tmp_path):
    d = data(tmp_path, {"bn": 4.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0}, seeds=2)
    assert [v.verdict for v in plateau.verdicts(d)] == ["not run yet"] * 4
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
    fake_run(d, ema, decomp=weights)
    run = Run.read(d, 0)
    s = decompose.split(run, EPOCHS)
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


def test_a_cell_that_does_not_learn_or_diverges_is_untestable(tmp_path):
    d = data(tmp_path, {"bn": 4.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0})
    for c in d.cells:  # frozen BN stuck near chance: no room to jitter
        if c.cell.meta["norm"] == "frozen_bn":
            for r in c.runs:
                r.rows = [{**x, "val/acc": 10.0 + 0.01 * (i % 2)} if "val/acc" in x else x
                          for i, x in enumerate(r.rows)]
                r._jitter.clear()
    assert plateau.c6(d).verdict == "untestable"
    assert "frozen BN does not learn" in plateau.c6(d).ours
    for c in d.cells:  # every seed of resnet18's syncbn diverged
        if c.cell.label == "resnet18 syncbn":
            for r in c.runs:
                r.status = "diverged"
    c1 = plateau.c1(d)
    assert c1.verdict == "reproduced"  # resnet20 alone, resnet18 left out and said so
    assert "resnet18 untestable" in c1.why and "resnet18 syncbn 5 of 5" in c1.ours
    assert plateau.combine({"a": "untestable", "b": "untestable"}) == "untestable"
    assert plateau.combine({"a": "untestable", "b": "not run yet"}) == "untestable"
    assert plateau.combine({"a": "reproduced", "b": "not reproduced"}) == "partly"


def test_c8_on_the_headline_protocol_is_paired_at_epoch_ends(tmp_path):
    cells = []
    for label, gain in (("resnet20 bn", 2.0), ("resnet20 syncbn", 0.5)):
        runs = []
        for s in range(3):
            weights = list(40 + np.zeros(200))
            d = tmp_path / label / f"seed{s}"
            # the EMA statistics cost `gain` points at every evaluation
            fake_run(d, [w - gain for w in weights], decomp=weights)
            runs.append(Run.read(d, s))
        cells.append(CellResult(Cell(label, [], [0, 1, 2], cfg={"epochs": EPOCHS}), runs, 3))
    d = RunsData(None, cells, "t", tmp_path, tmp_path)
    assert decompose.gains(cells[0]) == pytest.approx([2.0] * 3)
    v = decompose.c8(d)
    assert v.verdict == "partly"  # bn gains 2 (reproduced), syncbn 0.5 (partly)
    assert "resnet20 bn reproduced, resnet20 syncbn partly" in v.why
    for r in cells[1].runs[1:]:  # two of syncbn's three seeds diverged: syncbn is left out
        r.status = "diverged"
    v = decompose.c8(d)
    assert v.verdict == "reproduced" and "resnet20 syncbn untestable" in v.why
    assert "1 of 3 finished seeds have a gain (2 diverged" in v.ours
    assert "the rule of 1fc01e2 gives not run yet" in v.ours


def variant_cells(tmp_path, noise: dict[str, float]) -> list[CellResult]:
    out = []
    for variant in plateau.VARIANTS:
        for norm in ("bn", "syncbn"):
            runs = []
            for s in range(3):
                d = tmp_path / "v" / variant / norm / f"seed{s}"
                fake_run(d, curve(7 * s + len(out) + 500, noise[norm]))
                runs.append(Run.read(d, s))
            cell = Cell(f"resnet20 {norm}, {variant}", [], [0, 1, 2], cfg={"epochs": EPOCHS},
                        meta={"model": "resnet20", "norm": norm, "variant": variant})
            out.append(CellResult(cell, runs, 3))
    return out


def test_c4_is_ruled_only_where_c1_holds(tmp_path):
    d = data(tmp_path, {"bn": 4.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0})
    assert plateau.c4(d).verdict == "not run yet"  # no variant cells yet
    d.cells += variant_cells(tmp_path, {"bn": 4.0, "syncbn": 1.0})
    assert plateau.c4(d).verdict == "reproduced"
    flat = data(tmp_path / "flat", {"bn": 1.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0})
    v = plateau.c4(flat)  # no effect to survive: its own cells cannot change the verdict
    assert v.verdict == "untestable" and "fewer than 3 seeds finished" in v.ours
    flat.cells += variant_cells(tmp_path / "flat", {"bn": 4.0, "syncbn": 1.0})
    v = plateau.c4(flat)
    assert v.verdict == "untestable" and "no effect to survive" in v.why


def coin_run(d, accs, seed: int):
    """Like fake_run, but each evaluation's right answers are a fresh random set of acc% of
    the images: every flip is a fair coin, so the jitter sits at the churn floor."""
    fake_run(d, accs)
    rng = np.random.default_rng(seed)
    lines = (d / PREDICTIONS).read_text().splitlines()
    out = [lines[0]]
    for line, a in zip(lines[1:], accs, strict=True):
        row = json.loads(line)
        right = rng.permutation(N) < round(a * N / 100)
        row["pred"] = encode_classes((~right).astype(np.uint8))
        out.append(json.dumps(row))
    (d / PREDICTIONS).write_text("\n".join(out) + "\n")


def test_c1_is_partly_where_bn_is_separated_but_within_the_churn_floor(tmp_path):
    cells = []
    for norm, noise in (("bn", 2.0), ("syncbn", 0.5)):
        runs = []
        for s in range(5):
            d = tmp_path / norm / f"seed{s}"
            coin_run(d, curve(10 * s + len(cells), noise), seed=s)
            runs.append(Run.read(d, s))
        cell = Cell(f"resnet20 {norm}", [], list(range(5)),
                    cfg={"epochs": EPOCHS, "optim": {"lr": 0.1}},
                    meta={"model": "resnet20", "norm": norm})
        cells.append(CellResult(cell, runs, 5))
    d = RunsData(None, cells, "t", tmp_path, tmp_path)
    bn = plateau.cell(d, "resnet20", "bn")
    # coin flips of ~half the images: floor sqrt(f / 2N) with f about 2a(1 - a)
    assert 1.4 < np.mean(plateau.vals(bn, "churn_floor")) < 1.7
    assert np.mean(plateau.vals(bn, "over_floor")) < plateau.FLOOR_RATIO
    outcome, text = plateau.c1_model(d, "resnet20")
    assert outcome == "partly", text  # separated and 4x, but bn within 1.5x its floor


def chosen(monkeypatch, d, values: dict[str, dict[str, list[float]]]):
    """Give each cell (by norm) chosen per-seed values of the measures the rules read."""
    def vals(c, key=plateau.MEASURE):
        return [] if c is None else values[c.cell.meta["norm"]].get(key, [])
    monkeypatch.setattr(plateau, "vals", vals)


def test_c1_is_untestable_where_bn_does_not_learn_and_says_what_the_old_rule_gives(
        tmp_path, monkeypatch):
    d = data(tmp_path, {"bn": 4.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0}, seeds=3)
    chosen(monkeypatch, d, {
        "bn": {"vn_sd": [4.0, 4.2, 3.9], "plateau_acc": [12.0, 13.0, 11.0],
               "over_floor": [3.0, 3.0, 3.0]},
        "syncbn": {"vn_sd": [1.0, 1.1, 0.9], "plateau_acc": [40.0, 41.0, 39.0]}})
    outcome, text = plateau.c1_model(d, "resnet20")
    assert outcome == "untestable"
    assert "bn does not learn" in text and "checked only syncbn, gives reproduced" in text
    c4 = plateau.c4(d)  # C4 rests on C1 there: it says what C1's old rule would give
    assert "With C1's rule of 1fc01e2 (C1 on resnet20: reproduced)" in c4.why


def test_c9_needs_gn_near_the_lowest_jitter_and_says_what_the_old_rule_gives(
        tmp_path, monkeypatch):
    d = data(tmp_path, {"bn": 4.0, "syncbn": 1.0, "gn": 1.0, "frozen_bn": 1.0})
    acc = {"plateau_acc": [40.0] * 5}
    low = [1.0, 1.45, 1.1, 1.2, 0.9]  # mean 1.13
    values = {"bn": {"vn_sd": [4.0, 4.1, 3.9, 4.2, 4.0], **acc},
              "syncbn": {"vn_sd": low, **acc}, "frozen_bn": {"vn_sd": low, **acc},
              "gn": {"vn_sd": [1.5, 1.0, 1.6, 1.2, 1.4], **acc}}  # mean 1.34: 1.19x
    chosen(monkeypatch, d, values)
    outcome, text = plateau.c9_model(d, "resnet20")
    assert outcome == "partly", text  # close, and not separated above, but over 1.1x
    assert "the rule of 1fc01e2 gives reproduced" in text
    values["gn"]["vn_sd"] = [1.0, 1.2, 1.1, 1.15, 1.0]  # mean 1.09: the steadiest
    values["gn"]["plateau_acc"] = [47.0] * 5  # 7 points above syncbn: not "close"
    outcome, text = plateau.c9_model(d, "resnet20")
    assert outcome == "partly" and "gives reproduced" in text  # the old rule: one-sided
