"""The demo report (`make demo`): a table and a plot from run directories."""

from __future__ import annotations

import yaml

from bnlab.lab import report
from conftest import fake_run


def test_the_demo_report_is_built_from_the_runs_logs(tmp_path):
    d = tmp_path / "run"
    fake_run(d, [10.0, 20.0, 30.0])
    cfg = {"model": {"name": "resnet20"}, "norm": {"kind": "bn"}, "batch_per_gpu": 2,
           "grad_accum": 4}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert report.main([str(d), "--out", str(tmp_path / "out"), "--title", "t"]) == 0
    text = (tmp_path / "out" / "table.md").read_text()
    assert "| resnet20 bn ?x2 acc4 | completed | 30.00 | 30.00 |" in text
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0


def test_a_folder_without_metrics_is_one_sentence(tmp_path, capsys):
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bnlab: error: ") and "holds no metrics.jsonl" in err
    assert len(err.splitlines()) == 1 and not (tmp_path / "out").exists()
