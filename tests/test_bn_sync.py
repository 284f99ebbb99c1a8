"""Epoch-end BN sync: broadcast, reduce (timm) and pooled (the union), simulated and on gloo."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import bnlab
from bnlab import dist
from bnlab.batchnorm import RankBatchNorm
from bnlab.errors import BnlabError
from bnlab.metrics import read_jsonl
from bnlab.simulate import simulate
from conftest import SMOKE, needs_cifar, run_dirs, run_here

W, C = 4, 3


def _rank_stats() -> tuple[torch.Tensor, torch.Tensor]:
    """(W, C) running means and variances that differ between ranks."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(W, C, generator=g) * 2, torch.rand(W, C, generator=g) + 0.5


def _expected(mode: str) -> tuple[np.ndarray, np.ndarray]:
    means, variances = _rank_stats()
    if mode == "broadcast":
        return means[0].numpy(), variances[0].numpy()
    spread = (means - means.mean(0)).pow(2).mean(0) if mode == "pooled" else 0
    return means.mean(0).numpy(), (variances.mean(0) + spread).numpy()


def _simulated() -> RankBatchNorm:
    bn = simulate(RankBatchNorm(C), W)
    means, variances = _rank_stats()
    bn.ranks_running()[0].copy_(means)
    bn.ranks_running()[1].copy_(variances)
    bn.running_mean.copy_(means[0])
    bn.running_var.copy_(variances[0])
    return bn


@pytest.mark.parametrize("mode", ["broadcast", "reduce", "pooled"])
def test_simulated_ranks_all_take_the_chosen_statistics(mode):
    bn = _simulated()
    out = bnlab.sync_bn_stats(nn.Sequential(bn), mode)
    mean, var = _expected(mode)
    for r in range(W):
        np.testing.assert_allclose(bn.rank_stats(r)[0], mean, rtol=1e-6)
        np.testing.assert_allclose(bn.rank_stats(r)[1], var, rtol=1e-6)
    # what reduce misses: the spread of the rank means, as a share of the pooled variance
    pooled = _expected("pooled")[1]
    gap = (pooled - _expected("reduce")[1]) / pooled
    assert out["bn_sync/reduce_var_gap"] == pytest.approx(gap.mean(), rel=1e-5)
    assert gap.mean() > 0.3  # rank means 2 sd apart: reduce is far from the union


MODES = ["broadcast", "reduce", "pooled"]


def _worker(modes: list[str]) -> dict:
    """Each mode on this rank, in one gloo process group (one launch for every mode)."""
    env = dist.init("cpu", "gloo", threads=1)
    res = {}
    for mode in modes:
        bn = nn.BatchNorm2d(C)
        means, variances = _rank_stats()
        bn.running_mean.copy_(means[env.rank])
        bn.running_var.copy_(variances[env.rank])
        out = bnlab.sync_bn_stats(nn.Sequential(bn), mode)
        res[mode] = {"mean": bn.running_mean.numpy().copy(), "var": bn.running_var.numpy().copy(),
                     "gap": out["bn_sync/reduce_var_gap"]}
    dist.teardown()
    return res


@pytest.fixture(scope="module")
def gloo_ranks() -> dict:
    """mode -> each gloo rank's result, from one launch of W processes."""
    res = dist.launch_local(_worker, W, MODES)
    return {mode: [r[mode] for r in res] for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_gloo_ranks_agree_with_the_simulation(mode, gloo_ranks):
    res = gloo_ranks[mode]
    mean, var = _expected(mode)
    simulated = bnlab.sync_bn_stats(nn.Sequential(_simulated()), mode)["bn_sync/reduce_var_gap"]
    for r in res:
        np.testing.assert_allclose(r["mean"], mean, rtol=1e-6)
        np.testing.assert_allclose(r["var"], var, rtol=1e-6)
        assert r["gap"] == pytest.approx(simulated, rel=1e-6)


def test_none_changes_nothing_and_unknown_is_refused():
    bn = _simulated()
    assert bnlab.sync_bn_stats(bn, "none") == {}
    assert torch.equal(bn.rank_stats(1)[0], _rank_stats()[0][1])
    with pytest.raises(BnlabError, match="dist.bn_sync='mean' is unknown"):
        bnlab.sync_bn_stats(bn, "mean")


@pytest.mark.slow  # CI time (42 s); make test-slow runs it
@needs_cifar
def test_trainer_syncs_at_each_epoch_end_and_warns_when_moot(tmp_path):
    common = [*SMOKE, "dist.simulate=2", "batch_per_gpu=4", "dist.bn_sync=pooled"]
    r = run_here("train.py", *common, "dist.broadcast_buffers=false",
                  f"output_dir={tmp_path / 'own'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "changes little here" not in r.stdout + r.stderr  # no moot warning: it syncs
    run = run_dirs(tmp_path / "own")[0]
    rows = read_jsonl(run / "metrics.jsonl")
    gaps = [x["bn_sync/reduce_var_gap"] for x in rows if "bn_sync/reduce_var_gap" in x]
    assert len(gaps) == 1 and 0 < gaps[0] < 1  # one epoch end; ranks kept their own EMAs
    ranks = torch.load(run / "checkpoint.pt", weights_only=True)["rank_bn_stats"]
    assert len(ranks) == 2 and ranks[0].keys() == ranks[1].keys()
    for name, (mean, var) in ranks[0].items():  # after the sync both ranks hold the union
        assert torch.equal(mean, ranks[1][name][0]) and torch.equal(var, ranks[1][name][1])
    r = run_here("train.py", *common, "max_steps=2", f"output_dir={tmp_path / 'moot'}",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dist.bn_sync=pooled changes little here" in r.stdout + r.stderr
    r = run_here("train.py", *SMOKE, "dist.bn_sync=mean", f"output_dir={tmp_path / 'bad'}",
                  cwd=tmp_path)
    assert r.returncode == 2 and "dist.bn_sync must be one of" in r.stderr
    assert run_dirs(tmp_path / "bad") == []  # refused before any run directory
