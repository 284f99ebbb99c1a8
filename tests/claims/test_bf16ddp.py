"""table-bf16ddp on runs made up for the case: each run's divergence step (from status.json),
real DDP against the simulation by its rules, the CUDA steps read from the committed runs, and
its page before any run and with runs."""

from __future__ import annotations

import json
from pathlib import Path

from bnlab.claims import bf16ddp
from bnlab.lab.plan import Cell, Spec
from bnlab.lab.results import CellResult, Run
from bnlab.lab.table import RunsData


def run(tmp: Path, by: str, seed: int, status: str, step: int) -> Run:
    path = tmp / by / f"seed{seed}"
    path.mkdir(parents=True)
    (path / "status.json").write_text(json.dumps({"status": status, "step": step}))
    rows = [{"step": s, "epoch": s / 636, "train/loss": 2.3} for s in range(50, step + 1, 50)]
    return Run(path, status, rows, seed=seed)


def made_up(tmp: Path) -> RunsData:
    """Seed 0: both diverge (at 1,100 and 1,250); seed 1: the simulation diverges at 450, real
    DDP trains to the cap; seed 2: the simulation only, so far."""
    sim = CellResult(Cell("simulated ranks", [], [0, 1, 2], meta={"by": "simulated"}),
                     [run(tmp, "sim", 0, "diverged", 1100), run(tmp, "sim", 1, "diverged", 450),
                      run(tmp, "sim", 2, "diverged", 350)], 3)
    real = CellResult(Cell("real gloo DDP", [], [0, 1, 2], meta={"by": "real"}),
                      [run(tmp, "real", 0, "diverged", 1250),
                       run(tmp, "real", 1, "completed", 2000)], 3)
    spec = Spec("bf16ddp", "t", "headline", [sim.cell, real.cell], tmp / "sweep.yaml", {})
    return RunsData(spec, [sim, real], "cifar10-5085", tmp, tmp)


def test_the_cuda_runs_diverged_where_table_values_says():
    assert bf16ddp.cuda_steps() == {0: 1100, 1: 450, 2: 350}


def test_real_ddp_agrees_where_both_diverge_and_not_where_one_trains_to_the_cap(tmp_path):
    rows = bf16ddp.by_seed(made_up(tmp_path), cuda={0: 1100, 1: 450, 2: 350})
    assert [(r["simulated"], r["real"], r["agree"], r["holds"]) for r in rows] == [
        (1100, 1250, "agree", True), (450, "none", "disagree", False),
        (350, None, "to come", None)]


def test_the_page_and_figure_build_before_and_with_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(bf16ddp, "cuda_steps", lambda: {0: 1100, 1: 450, 2: 350})
    d = made_up(tmp_path)
    md = bf16ddp.render(d)
    assert "| 0 | diverged at step 1,100 | diverged at step 1,100 | diverged at step 1,250 | " \
        "agree (150 steps apart) | yes |" in md
    assert "| 1 | diverged at step 450 | diverged at step 450 | no divergence in 2,000 steps " \
        "| disagree | no: the simulation's |" in md
    bf16ddp.plot(d, tmp_path / "bf16ddp.png")
    assert (tmp_path / "bf16ddp.png").stat().st_size > 10_000
