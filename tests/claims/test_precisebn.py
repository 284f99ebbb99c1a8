"""L2/C8: PreciseBN settings measured on a real checkpoint, and the table and verdict built
from the measurements (PreciseBN's maths is tested against torch in test_precise_bn.py)."""

from __future__ import annotations

import copy
import json

import pytest

from bnlab import claims, dist, trainer
from bnlab.claims import precisebn
from bnlab.errors import BnlabError
from bnlab.evaluation import load_trained
from bnlab.lab.spec import load_spec
from conftest import CIFAR_MINI, needs_cifar


def _rows(base: float) -> list[dict]:
    """One row per grid setting: accuracy rises with samples, averaged loses 3 at batch 2."""
    out = []
    for s in precisebn.grid():
        acc = base + min(s.samples, 4096) / 1024 + 0.1 * s.repeat
        if s.pooling == "averaged" and s.batch in (2, 8):
            acc -= 3
        out.append({**s.__dict__, "images": s.samples, "seconds": s.samples / 1000
                    * (10 if s.estimator == "eval" else 1), "acc": acc})
    return out


RES = {"date": "2026-11-22", "tag": "cifar10-9",
       "runs": {"bn 4x2": {"seed": 1, "run": "r", "ema_acc": 20.0, "train_images": 5085,
                           "rows": _rows(20.0)},
                "syncbn 4x2": {"seed": 1, "run": "s", "ema_acc": 36.0, "train_images": 5085,
                               "rows": _rows(38.0)}}}


def test_grid_measures_the_default_once_per_draw_and_every_axis():
    g = precisebn.grid()
    assert len(g) == len(set(g))
    est, pool, n, b = precisebn.DEFAULT
    assert len([s for s in g if (s.estimator, s.pooling, s.samples, s.batch) == (est, pool, n, b)
                ]) == precisebn.REPEATS
    assert {s.samples for s in g} >= set(precisebn.SAMPLES)
    assert {s.batch for s in g} >= set(precisebn.BATCHES)
    assert {(s.estimator, s.pooling) for s in g} == {("train", "pooled"), ("train", "averaged"),
                                                       ("eval", "pooled"), ("eval", "averaged")}


@needs_cifar
def test_eval_estimator_with_pooling_does_not_depend_on_the_batch(tmp_path):
    """A real checkpoint: the eval estimator's pooled statistics of the same images are the
    same whatever the PreciseBN batch, so the accuracy is too; the rows say what was done."""
    cell = load_spec(precisebn.TABLE.spec_path).cells[0]
    cfg = json.loads(json.dumps(cell.cfg))
    cfg["data"].update(root=str(CIFAR_MINI), download=False, val_limit=64, train_limit=64)
    cfg.update(epochs=1, eval_every=1, progress=False, checkpoint=True)
    trainer.run(cfg, tmp_path, dist.init("cpu", "auto", 60, 1))
    run = load_trained(tmp_path)
    a = precisebn.recalibrated(run, precisebn.Setting("eval", "pooled", 32, 8))
    b = precisebn.recalibrated(run, precisebn.Setting("eval", "pooled", 32, 32))
    assert a["acc"] == pytest.approx(b["acc"], abs=1e-9)
    assert (a["images"], a["batch"], a["estimator"]) == (32, 8, "eval") and a["seconds"] > 0
    c = precisebn.recalibrated(run, precisebn.Setting("train", "pooled", 96, 32))
    assert c["images"] == 96  # more than the 64 training images: the next epoch's order


def test_missing_checkpoint_is_one_sentence(tmp_path):
    with pytest.raises(BnlabError, match="no checkpoint on this machine"):
        precisebn.measure_run(tmp_path / "seed1")


def test_table_has_every_axis_the_default_and_the_verdict():
    text = precisebn.table(RES)
    assert "| bn 4x2 | train, pooled | 20.00 | 20.35 ± 0.10 |" in text
    assert "| bn 4x2 | train, averaged | " in text and "| syncbn 4x2 | eval, pooled | " in text
    assert "| batch 2 | batch 8 | batch 32 | batch 128 | batch 512 |" in text
    assert "bn 4x2: default 24.10 vs EMA 20.00 (+4.10)" in text
    assert "**L2 verdict: reproduced.**" in text


def test_verdict_follows_the_numbers():
    res = copy.deepcopy(RES)
    for r in res["runs"]["bn 4x2"]["rows"]:
        if r["pooling"] == "averaged" and r["batch"] == 8 and r["estimator"] == "eval":
            r["acc"] += 3  # averaged no worse where only the pooling differs
    assert precisebn.verdict(res).verdict == "partly"
    for r in res["runs"]["bn 4x2"]["rows"]:
        if r["samples"] == 8192:
            r["acc"] += 5  # 4096 samples no longer enough
    assert precisebn.verdict(res).verdict == "not reproduced"


def test_report_without_results_is_one_sentence(tmp_path, capsys):
    assert claims.main(["precisebn", "--report", "--experiments", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("bnlab: error: no ")
