"""Export: in eval mode `torch.export.export` takes a converted model of every kind, and the
reverted one; `torch.jit.script` takes the reverted one (not bnlab's batch-statistics layers,
whose training forward holds Python it cannot compile). docs/library.md says so."""

from __future__ import annotations

import copy

import pytest
import torch

import bnlab
from bnlab.models import BasicBlock
from bnlab.norms import NORMS

BATCH_STAT = ("bn", "syncbn", "syncbn_naive", "frozen_bn", "brn")


def _trained_block(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(BasicBlock(4, 8, 2))
    with torch.no_grad():  # statistics a fresh layer does not have
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
    opts = {"groups": 4} if kind in ("gn", "gnws", "evonorm") else {}
    return bnlab.convert(model, kind, **opts).eval()


@pytest.mark.parametrize("kind", sorted(NORMS))
def test_torch_export_takes_every_kind_converted_and_reverted(kind):
    model = _trained_block(kind)
    x = torch.randn(2, 4, 8, 8)
    for m in (model, bnlab.revert(copy.deepcopy(model))):
        exported = torch.export.export(m, (x,))
        torch.testing.assert_close(exported.module()(x), m(x), rtol=0, atol=0)
        torch.testing.assert_close(m(x), model(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(NORMS))
def test_jit_script_takes_the_reverted_model_of_every_kind(kind):
    model = bnlab.revert(_trained_block(kind))
    x = torch.randn(2, 4, 8, 8)
    torch.testing.assert_close(torch.jit.script(model)(x), model(x))


@pytest.mark.parametrize("kind", BATCH_STAT)
def test_jit_script_refuses_bnlabs_batch_statistics_layers_as_documented(kind):
    with pytest.raises(RuntimeError):
        torch.jit.script(_trained_block(kind))
