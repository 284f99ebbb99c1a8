"""python -m bnlab runs / plot: a table across any runs and their curves, and the multirun's
closing table."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from bnlab.__main__ import main
from bnlab.lab import runs
from conftest import fake_run


def two_runs(root):
    for i, lr in enumerate((0.1, 0.01)):
        d = root / str(i)
        fake_run(d, [30.0 + i] * 25)
        info = json.loads((d / "run.json").read_text())
        info["overrides"] = [f"optim.lr={lr}", "norm=bn", f"hydra.run.dir={d}"]
        (d / "run.json").write_text(json.dumps(info))


def test_the_table_shows_the_overrides_that_differ_and_each_runs_numbers(tmp_path, capsys):
    two_runs(tmp_path)
    assert main(["runs", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| run | optim.lr | status | final val acc (%)" in out  # norm=bn is shared: left out
    assert "| 0 | 0.1 | completed | 30.0 |" in out and "| 1 | 0.01 | completed | 31.0 |" in out


def test_plot_draws_every_run_and_a_missing_folder_is_one_sentence(tmp_path, capsys):
    two_runs(tmp_path / "m")
    assert main(["plot", str(tmp_path / "m"), "--out", str(tmp_path / "r.png")]) == 0
    assert (tmp_path / "r.png").stat().st_size > 10_000
    assert main(["runs", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("bnlab: error: ")


def test_a_multirun_ends_with_its_table(tmp_path, capsys):
    two_runs(tmp_path)
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    runs.MultirunTable().on_multirun_end(cfg)
    assert "| 1 | 0.01 | completed |" in capsys.readouterr().out


def test_a_multirun_whose_jobs_left_nothing_says_so(tmp_path, capsys):
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    runs.MultirunTable().on_multirun_end(cfg)
    assert "no run directory" in capsys.readouterr().out
