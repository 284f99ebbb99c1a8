"""C10's table and verdict from evaluation results (the checkpoints' evaluation itself is
evaluate.py's, tested in test_diagnostics.py)."""

from __future__ import annotations

import copy

from bnlab import claims
from bnlab.claims import evalmode

ACC = {"eval mode, batch 1": 40.0, "eval mode, batch 8": 40.0, "eval mode, batch 256": 40.0,
       "train mode, batch 2": 20.0, "train mode, batch 8": 30.0, "train mode, batch 32": 37.0,
       "train mode, batch 256": 39.0, "PreciseBN (train estimator)": 41.0}
RES = {"date": "2026-11-22", "tag": "cifar10-9",
       "evals": {"bn 4x2": {"seed": 1, "run": "r", "val_acc": ACC},
                 "bn 1x32": {"seed": 1, "run": "s", "val_acc": dict(ACC)}},
       "moves": {"run": "r", "forwards": 10, "batch": 32, "acc_before": 40.0,
                 "acc_after": 35.0, "max_relative_change": 0.5, "layers_changed": 40,
                 "buffers": 40}}


def test_table_shows_every_batch_size_and_the_demonstration():
    text = evalmode.table(RES)
    assert "| eval mode batch 1 | eval mode batch 8 | eval mode batch 256 | train mode batch 2" \
        in text
    assert "| bn 4x2 (seed 1) | 40.00 | 40.00 | 40.00 | 20.00 | 30.00 | 37.00 | 39.00 |" in text
    assert "changed 40 of 40 running-statistics buffers" in text
    assert "from 40.00% to 35.00%" in text
    assert "**C10 verdict: reproduced.**" in text


def test_verdict_follows_the_numbers():
    res = copy.deepcopy(RES)
    res["evals"]["bn 4x2"]["val_acc"]["eval mode, batch 1"] = 39.0  # eval mode not flat
    assert evalmode.verdict(res).verdict == "partly"
    res["moves"]["layers_changed"] = 0
    assert evalmode.verdict(res).verdict == "not reproduced"


def test_report_without_results_is_one_sentence(tmp_path, capsys):
    assert claims.main(["evalmode", "--report", "--experiments", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("bnlab: error: no ")


def test_a_run_without_checkpoint_or_eval_json_is_one_sentence(tmp_path):
    import pytest

    from bnlab.errors import BnlabError
    from bnlab.lab.results import eval_json

    with pytest.raises(BnlabError, match="no checkpoint on this machine .*table-evalmode RUNS="):
        eval_json(tmp_path, "table-evalmode")
