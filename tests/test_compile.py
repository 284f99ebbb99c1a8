"""torch.compile: every kind traces without a graph break, in train and eval mode, on one rank
and on simulated ranks; no kind recompiles as training goes on (Batch Renorm's ramp moving
included); `train.py compile=true` trains (slow: inductor on the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.testing import CompileCounter

import bnlab
from bnlab.metrics import read_jsonl
from bnlab.models import BasicBlock
from bnlab.norms import NORMS
from bnlab.simulate import SimulatedDDP
from conftest import SMOKE, needs_cifar, run_here

BATCH_STAT = ("bn", "syncbn", "syncbn_naive", "frozen_bn", "brn")


def _block(kind: str) -> torch.nn.Module:
    """A residual block with a projection shortcut (every place a norm sits in resnet20)."""
    torch.manual_seed(0)
    opts = {"groups": 4} if kind in ("gn", "gnws", "evonorm") else {}
    if kind == "brn":
        opts = {"hold_steps": 1, "r_ramp_steps": 3, "d_ramp_steps": 2}
    return bnlab.convert(torch.nn.Sequential(BasicBlock(4, 8, 2)), kind, **opts)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("kind", sorted(NORMS))
def test_every_kind_traces_without_a_graph_break(kind, mode):
    model = _block(kind).train(mode == "train")
    dynamo.reset()
    explained = dynamo.explain(model)(torch.randn(4, 4, 8, 8))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@pytest.mark.parametrize("kind", BATCH_STAT)
def test_every_batch_statistics_kind_traces_whole_on_simulated_ranks(kind):
    model = SimulatedDDP(_block(kind), 2).train()
    dynamo.reset()
    explained = dynamo.explain(model.module)(torch.randn(4, 4, 8, 8))
    assert explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.parametrize("kind", ["bn", "syncbn", "brn", "gnws"])
def test_no_kind_recompiles_as_training_goes_on(kind):
    """Eight optimizer steps on 2 simulated ranks (Batch Renorm's hold and both ramps among
    them): one graph, compiled once, and the eager model's losses."""
    eager = _block(kind)
    compiled = copy.deepcopy(eager)
    counter = CompileCounter()
    dynamo.reset()
    compiled.compile(backend=counter, fullgraph=True)
    losses = []
    for model in (eager, compiled):
        net = SimulatedDDP(model, 2).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1)
        out = []
        for _ in range(8):
            loss = net(torch.randn(4, 4, 8, 8, generator=g)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses.append(out)
    assert counter.frame_count == 1
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)


def test_momentum_none_breaks_the_graph_as_torchs_own_batchnorm_does():
    """The cumulative average reads the batch count on the host (torch's BN does the same):
    the one known break, documented in docs/library.md."""
    model = bnlab.convert(torch.nn.Sequential(torch.nn.BatchNorm2d(4)), "bn", momentum=None)
    dynamo.reset()
    explained = dynamo.explain(model.train())(torch.randn(4, 4, 2, 2))
    assert (explained.graph_count, explained.graph_break_count) != (1, 0)  # not one whole graph


@pytest.mark.slow
@needs_cifar
def test_train_py_compile_true_trains_with_inductor(tmp_path):
    r = run_here("train.py", *SMOKE, "norm=syncbn", "dist.simulate=2", "batch_per_gpu=4",
                 "compile=true", "data.train_limit=64", "checkpoint=false",
                 f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    losses = [row["train/loss"] for row in rows if "train/loss" in row]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
