"""bnlab.count_collectives: the collectives a block issues, by name (the check for evaluation
that hangs when ranks evaluate different numbers of batches; examples/cases/eval_collectives.py
runs it on 2 ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as tdist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import bnlab
from bnlab.errors import BnlabError


@pytest.fixture
def one_rank(tmp_path):
    tdist.init_process_group("gloo", store=tdist.FileStore(str(tmp_path / "store"), 1), rank=0,
                             world_size=1)
    yield
    tdist.destroy_process_group()


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))


def test_ddp_s_buffer_sync_is_counted_in_eval_with_gradients_on_and_not_under_no_grad(one_rank):
    x = torch.randn(2, 3, 6, 6)
    model = net()
    model(x)  # the lazy layer's shape
    ddp = DistributedDataParallel(model)
    ddp(x).sum().backward()  # a training step leaves the wrapper set to sync its buffers
    ddp.eval()
    with bnlab.count_collectives() as seen:
        ddp(x)
        ddp(x)
    assert seen == {"_broadcast_coalesced": 2}  # before each forward with gradients on
    assert "2 collective(s), _broadcast_coalesced x2 (DDP's buffer sync)" in seen.say()
    assert "model.module" in seen.say()
    with bnlab.count_collectives() as none, torch.no_grad():
        ddp.module(x)
    assert none == {} and none.say().startswith("this step issues no collective")
    assert tdist._broadcast_coalesced is not None and \
        not hasattr(tdist._broadcast_coalesced, "__wrapped__")  # put back after the block


def test_an_all_reduce_in_the_block_is_counted_and_the_functions_come_back(one_rank):
    before = tdist.all_reduce
    with bnlab.count_collectives() as seen:
        tdist.all_reduce(torch.ones(1))
        tdist.barrier()
    assert seen == {"all_reduce": 1, "barrier": 1} and tdist.all_reduce is before


def test_a_process_group_that_does_not_hold_the_rank_is_refused(one_rank, monkeypatch):
    # on one rank every group holds it; torch answers -1 for a rank outside the group
    monkeypatch.setattr(tdist, "get_rank", lambda group=None: -1 if group is not None else 0)
    with pytest.raises(BnlabError, match="does not hold this rank \\(0\\): every rank must "
                       "create every group"):
        bnlab.convert(nn.BatchNorm2d(4), "syncbn", process_group=object())
