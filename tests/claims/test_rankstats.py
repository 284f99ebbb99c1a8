"""C7: the ranks' running statistics read from a real checkpoint, and the table and verdict
built from them (evaluate.py's per-rank accuracies are tested in test_diagnostics.py)."""

from __future__ import annotations

import copy
import json
import math

import pytest

from bnlab import claims, dist, trainer
from bnlab.claims import rankstats
from bnlab.errors import BnlabError
from bnlab.lab.spec import load_spec
from conftest import CIFAR_MINI, needs_cifar

ACC = {"eval mode, batch 256": 30.0, "rank 0 running statistics": 30.0,
       "rank 1 running statistics": 25.0, "rank 2 running statistics": 28.0,
       "rank 3 running statistics": 27.0, "average of the ranks' statistics": 29.0,
       "PreciseBN (train estimator)": 31.0, "PreciseBN (eval estimator)": 30.5}


def _run(buffers: str, div: float) -> dict:
    return {"seed": 1, "run": "r", "buffers": buffers, "layers": ["bn1", "layer1.0.bn1", "x"],
            "div_mean": [div, 2 * div, div / 2], "div_logvar": [0.1, 0.2, 0.3],
            "state_vs_rank": {"rank 0": 0.0, "rank 1": 0.2, "rank 2": 0.1, "rank 3": 0.3},
            "val_acc": dict(ACC)}


RES = {"date": "2026-11-22", "tag": "cifar10-9",
       "runs": {"bn 4x2, buffer sync on": _run("on", 0.6),
                "bn 4x2, buffer sync off": _run("off", 1.5)},
       "state_difference": 0.0}


@needs_cifar
def test_checkpoint_keeps_rank_0_in_the_model_state_and_every_rank_beside_it(tmp_path):
    cell = next(c for c in load_spec(rankstats.TABLE.spec_path).cells if c.meta["buffers"] == "off")
    cfg = json.loads(json.dumps(cell.cfg))
    cfg["data"].update(root=str(CIFAR_MINI), download=False, val_limit=32, train_limit=32)
    cfg.update(epochs=1, eval_every=1, progress=False, checkpoint=True)
    trainer.run(cfg, tmp_path, dist.init("cpu", "auto", 60, 1))
    got = rankstats.checkpoint_stats(tmp_path)
    assert len(got["layers"]) == len(got["div_mean"]) == len(got["div_logvar"]) == 20
    assert got["state_vs_rank"]["rank 0"] == 0.0
    assert all(got["state_vs_rank"][f"rank {r}"] > 0 for r in (1, 2, 3))
    assert all(math.isfinite(v) and v >= 0 for v in got["div_mean"] + got["div_logvar"])
    assert max(got["div_mean"]) > 0
    assert rankstats.state_difference(tmp_path, tmp_path) == 0.0


def test_missing_checkpoint_is_one_sentence(tmp_path):
    with pytest.raises(BnlabError, match="no checkpoint on this machine .* `make "
                       "table-rankstats RUNS=<folder>`"):
        rankstats.checkpoint_stats(tmp_path)


def test_table_shows_divergence_what_the_checkpoint_keeps_and_accuracy_by_rank():
    text = rankstats.table(RES)
    assert "| bn 4x2, buffer sync on (seed 1) | 0.600 | 1.200 | 0.200 | 0.300 |" in text
    assert "| bn 4x2, buffer sync off | 0 | 0.2 | 0.1 | 0.3 |" in text
    assert "model states (every weight and rank 0's statistics) are identical" in text
    assert "differ by up to 0.5" in rankstats.table({**RES, "state_difference": 0.5})
    assert "| 1 | layer1.0.bn1 | 1.200 | 3.000 |" in text
    assert "| bn 4x2, buffer sync off | 30.00 | 25.00 | 28.00 | 27.00 | 29.00 | 31.00 | 30.50 |" \
        in text
    assert "**C7 verdict: reproduced.**" in text


def test_verdict_follows_the_numbers():
    res = copy.deepcopy(RES)
    res["runs"]["bn 4x2, buffer sync on"]["div_mean"] = [0.1, 0.2, 0.1]  # sync on: close
    assert rankstats.verdict(res).verdict == "partly"
    res["runs"]["bn 4x2, buffer sync on"]["state_vs_rank"]["rank 0"] = 0.01
    assert rankstats.verdict(res).verdict == "not reproduced"


def test_report_writes_table_plot_and_verdict(tmp_path):
    (tmp_path / "rankstats").mkdir()
    (tmp_path / "rankstats" / "results.json").write_text(json.dumps(RES))
    assert claims.main(["rankstats", "--report", "--experiments", str(tmp_path)]) == 0
    assert (tmp_path / "rankstats" / "rankstats.png").stat().st_size > 0
    assert "<!-- c7:begin -->" in (tmp_path / "README.md").read_text()


def test_report_without_results_is_one_sentence(tmp_path, capsys):
    assert claims.main(["rankstats", "--report", "--experiments", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("bnlab: error: no ")
