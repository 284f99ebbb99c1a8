"""bnlab.claims.ddpcheck: table-jitter's key cells, real 4-process DDP against the simulation."""

from __future__ import annotations

import json

import pytest
import torch

from bnlab.claims import ddpcheck
from conftest import CIFAR_MINI, needs_cifar


def test_the_recorded_steps_start_dense_and_end_at_the_last():
    assert ddpcheck.record_steps(20) == [1, 2, 3, 5, 10, 20]
    assert ddpcheck.record_steps(25) == [1, 2, 3, 5, 10, 20, 25]
    assert ddpcheck.record_steps(2) == [1, 2]


def test_the_difference_is_a_fraction_of_how_far_training_moved_the_weights():
    start = {"w": torch.zeros(4), "b": torch.zeros(2)}
    sim = {"w": torch.tensor([3.0, 0, 0, 0]), "b": torch.tensor([0.0, 4.0])}  # moved by 5
    real = {"w": torch.tensor([3.0, 0, 0, 1]), "b": torch.tensor([0.0, 4.0])}  # 1 apart
    assert ddpcheck.difference(real, sim, start) == pytest.approx(0.2)
    assert ddpcheck.difference(sim, sim, start) == 0.0


def test_the_jitter_table_shows_the_check_or_says_how_to_measure_it(tmp_path):
    assert "`python -m bnlab.claims.ddpcheck --data <dir>`" in \
        ddpcheck.section(tmp_path / "none.json")
    res = {"world": 4, "steps": 2, "seed": 0, "measure_s": 12.3,
           "cells": {"bn": {"float64, real vs simulated": {"1": 2.5e-15, "2": 1.2e-10}}}}
    (tmp_path / "ddpcheck.json").write_text(json.dumps(res))
    text = ddpcheck.section(tmp_path / "ddpcheck.json")
    assert "| bn | float64, real vs simulated | 2.5e-15 | 1.2e-10 |" in text
    assert "first 2 steps" in text and "Measured in 12 s" in text


def test_bad_arguments_are_one_sentence(tmp_path, capsys):
    assert ddpcheck.main(["--steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "bnlab: error: --steps must be 1 or more."
    assert ddpcheck.main(["--data", str(tmp_path / "nothing"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bnlab: error: data: CIFAR-10 not found") and len(err.splitlines()) == 1
    assert not (tmp_path / "ddpcheck.json").exists()


@pytest.mark.slow
@needs_cifar
def test_real_ddp_and_the_simulation_take_the_same_first_step_on_the_jitter_cells(tmp_path):
    """4 gloo processes, resnet18, the real data: about 1-2 minutes on 2 cores."""
    assert ddpcheck.main(["--data", str(CIFAR_MINI), "--steps", "2", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "ddpcheck.json").read_text())
    for cell in ("bn", "syncbn"):
        rows = res["cells"][cell]
        assert rows["float64, real vs simulated"]["1"] < 1e-12
        assert rows["float32, real vs simulated"]["1"] < 1e-3
        assert "float64, simulated vs itself with weights x (1 + 1e-15)" in rows
    assert res["cells"]["syncbn"]["float64, real vs simulated"]["2"] < 1e-12
