"""C12: the naive sync's variance bias measured on a real checkpoint, the step times read
from the benchmark's results, and the table and verdict built from them (the naive sync's
maths against torch is tested in test_syncbn / test_simulate)."""

from __future__ import annotations

import copy
import json

import pytest

from bnlab import claims, dist, trainer
from bnlab.claims import sync
from bnlab.errors import BnlabError
from bnlab.lab.spec import load_spec
from conftest import CIFAR_MINI, needs_cifar


def _cell(norm, batches, final):
    return {"seed": 1, "run": "r/seed1", "status": "completed", "final": final,
            "best": final + 1, "swing": 2.0, "loss": 1.5e5 if "naive" in norm else 2.25,
            "norm": norm, "batches": batches}


BENCH = {"machine": {"machine": "test box"},
         "runs": [{"id": 2, "date": "2026-11-22", "commit": "abcdef0123", "command": "bench"}],
         "rows": [{"section": "syncbn", "what": "syncbn, 4-process gloo, resnet18 x 2",
                   "value": 0.6, "ref": 0.3, "ref_what": "bn", "ratio": 2.0, "note": "",
                   "run": 2},
                  {"section": "syncbn", "what": "syncbn_naive, 4-process gloo, resnet18 x 2",
                   "value": 0.66, "ref": 0.3, "ref_what": "bn", "ratio": 2.2, "note": "",
                   "run": 2},
                  {"section": "sim", "what": "other", "value": 1, "ref": 1, "ratio": 1,
                   "run": 2}]}
RES = {"date": "2026-11-22", "tag": "cifar10-9",
       "cells": {f"{n}, {o}": _cell(n, o, 30.0 + i) for i, (n, o) in enumerate(
           [(n, o) for o in ("shuffled", "skewed") for n in ("bn", "syncbn", "syncbn_naive")])},
       "bias": {"shuffled": {"layers": ["bn1", "layer1.0.bn1"], "bias": [-0.1, -0.3],
                             "batches": 50, "from": "resnet18-syncbn-4x2-x"},
                "skewed": {"layers": ["bn1", "layer1.0.bn1"], "bias": [-0.4, -0.5],
                           "batches": 50, "from": "resnet18-syncbn-4x2-x"}},
       "bench": {}}


@needs_cifar
def test_naive_variance_is_never_above_the_union_and_skew_lowers_it(tmp_path):
    """On real weights: the mean of the ranks' variances cannot exceed the union's (it lacks
    the spread of the ranks' means), and sorting each batch by label across ranks widens that
    spread."""
    cell = next(c for c in load_spec(sync.TABLE.spec_path).cells
                if c.meta["norm"] == "syncbn" and c.meta["batches"] == "shuffled")
    cfg = json.loads(json.dumps(cell.cfg))
    cfg["data"].update(root=str(CIFAR_MINI), download=False, val_limit=32, train_limit=64)
    cfg.update(epochs=1, eval_every=1, progress=False, checkpoint=True)
    trainer.run(cfg, tmp_path, dist.init("cpu", "auto", 60, 1))
    got = sync.variance_bias(tmp_path, batches=8)
    plain, skewed = got["shuffled"], got["skewed"]
    assert len(plain["layers"]) == 20 and plain["batches"] == 8
    for b in (plain, skewed):
        assert all(-1 <= v <= 1e-9 for v in b["bias"])
    assert sync._median(skewed["bias"]) < sync._median(plain["bias"])


def test_missing_checkpoint_is_one_sentence(tmp_path):
    with pytest.raises(BnlabError, match="no checkpoint on this machine"):
        sync.variance_bias(tmp_path)


def test_step_times_come_from_the_benchmark_results(tmp_path):
    (tmp_path / "box.json").write_text(json.dumps(BENCH))
    got = sync.bench_rows(tmp_path)
    assert list(got) == ["test box"]
    assert [r["ratio"] for r in got["test box"]["rows"]] == [2.0, 2.2]
    assert got["test box"]["commit"] == "abcdef0123"
    assert sync.bench_rows(tmp_path / "none") == {}


def test_table_and_verdict(tmp_path):
    (tmp_path / "box.json").write_text(json.dumps(BENCH))
    res = {**RES, "bench": sync.bench_rows(tmp_path)}
    text = sync.table(res)
    assert "| syncbn_naive | skewed | 35.0 | 36.0 | ±2.0 | 1.5e+05 | completed |" in text
    assert "| bn | shuffled | 30.0 | 31.0 | ±2.0 | 2.25 | completed |" in text
    assert "| 1 | layer1.0.bn1 | -0.300 | -0.500 |" in text
    assert "| | median | -0.200 | -0.450 |" in text
    assert "| syncbn, 4-process gloo, resnet18 x 2 | 0.6000 | 0.3000 | 2.00x |" in text
    assert "sync every step 297 s/epoch, 76.1% top-1 (1.62x)" in text
    assert "**C12 verdict: reproduced.**" in text
    assert "step time syncbn 2.00x (4-process gloo, resnet18 x 2)" in sync.verdict(res).ours
    assert "No benchmark results" in sync.table(RES)


def test_verdict_follows_the_numbers():
    res = copy.deepcopy(RES)
    res["bias"]["skewed"]["bias"] = [-0.1, -0.2]  # skew no worse
    assert sync.verdict(res).verdict == "partly"
    res["bias"]["shuffled"]["bias"] = [0.0, -0.01]  # and hardly biased
    res["bias"]["skewed"]["bias"] = [0.0, -0.01]
    assert sync.verdict(res).verdict == "not reproduced"


def test_report_without_results_is_one_sentence(tmp_path, capsys):
    assert claims.main(["sync", "--report", "--experiments", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("bnlab: error: no ")
