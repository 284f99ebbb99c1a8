"""norm=brn (Batch Renormalization) against BN and its formula written out in float64, on one
rank and simulated ranks; norm=evonorm (EvoNorm-S0) against timm's layer."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bnlab
from bnlab.batchnorm import BatchRenorm
from bnlab.errors import BnlabError
from bnlab.norms import EvoNormS0
from bnlab.simulate import SimulatedDDP

RAMPED = {"hold_steps": 0, "r_ramp_steps": 0, "d_ramp_steps": 0}  # r_max and d_max from the start


def layer(c: int = 6, dtype=torch.float64, momentum: float | None = 0.1, **kw) -> BatchRenorm:
    """A brn layer with weight, bias and running statistics away from their defaults."""
    g = torch.Generator().manual_seed(3)
    m = BatchRenorm(c, momentum=momentum, dtype=dtype, **kw)
    with torch.no_grad():
        m.weight.copy_(torch.rand(c, generator=g, dtype=dtype) + 0.5)
        m.bias.copy_(torch.randn(c, generator=g, dtype=dtype))
        m.running_mean.copy_(torch.randn(c, generator=g, dtype=dtype))
        m.running_var.copy_(torch.rand(c, generator=g, dtype=dtype) * 4 + 0.1)
    return m


def written_out(x, w, b, mu, var, eps, r_max, d_max, f):
    """The paper's Algorithm 1 for one batch (N, C, H, W), in the input's dtype: output, and the
    running mean and variance after it (the variance held as sigma^2 - eps)."""
    mb = x.mean((0, 2, 3))
    sb = (x.var((0, 2, 3), unbiased=False) + eps).sqrt()
    sigma = (var + eps).sqrt()
    r = (sb / sigma).clamp(1 / r_max, r_max).detach()
    d = ((mb - mu) / sigma).clamp(-d_max, d_max).detach()
    c = (1, -1, 1, 1)
    y = ((x - mb.view(c)) / sb.view(c) * r.view(c) + d.view(c)) * w.view(c) + b.view(c)
    new_sigma = sigma + f * (sb.detach() - sigma)
    return y, mu + f * (mb.detach() - mu), new_sigma.square() - eps


def side_by_side(ours, ref, x: torch.Tensor, rtol: float, atol: float) -> None:
    """`ours` and `ref` on copies of `x`, one upstream gradient: outputs and input gradients
    close (parameter gradients are the caller's to compare)."""
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    ya, yb = ours(xa), ref(xb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=100 * rtol, atol=10 * atol)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_brn_equals_its_formula_in_float64(momentum):
    m = layer(momentum=momentum, r_max=1.5, d_max=0.5, **RAMPED)
    w, b = m.weight.detach().clone().requires_grad_(), m.bias.detach().clone().requires_grad_()
    mu, var = m.running_mean.clone(), m.running_var.clone()
    x = (torch.randn(4, 6, 5, 5, dtype=torch.float64) * 3 + 1).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y = m(x)
    ref, ref_mu, ref_var = written_out(x2, w, b, mu, var, m.eps, 1.5, 0.5,
                                       0.1 if momentum else 1.0)
    g = torch.randn_like(y)
    y.backward(g)
    ref.backward(g)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.weight.grad, w.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.bias.grad, b.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.running_mean, ref_mu, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m.running_var, ref_var, rtol=1e-12, atol=1e-12)
    # the clips bind here: r and d are not 1 and 0, so this is no BN in disguise
    bn = F.batch_norm(x2.detach(), None, None, w.detach(), b.detach(), True, 0.0, m.eps)
    assert (y.detach() - bn).abs().max() > 0.1


def test_brn_is_bn_when_r_max_is_1_and_d_max_0():
    m = layer(r_max=1.0, d_max=0.0, **RAMPED)
    bn = nn.BatchNorm2d(6, dtype=torch.float64)
    bn.load_state_dict(m.state_dict())
    x2 = torch.randn(4, 6, 5, 5, dtype=torch.float64) * 3 + 1
    side_by_side(m, bn, x2, 1e-12, 1e-12)
    torch.testing.assert_close(m.weight.grad, bn.weight.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(m.running_mean, bn.running_mean, rtol=1e-12, atol=1e-12)
    # the running variance follows the paper (an average of standard deviations), not BN's
    assert not torch.allclose(m.running_var, bn.running_var)
    m.eval()
    bn.eval()
    with torch.no_grad():  # evaluation: (x - mu) / sigma, torch's BN on its own buffers
        want = F.batch_norm(x2, m.running_mean, m.running_var, m.weight, m.bias, False, 0, m.eps)
        torch.testing.assert_close(m(x2), want, rtol=0, atol=0)


def test_the_limits_hold_then_ramp_linearly():
    m = layer(r_max=3.0, d_max=5.0, hold_steps=10, r_ramp_steps=40, d_ramp_steps=20)
    seen = []
    for n in (0, 10, 20, 30, 50, 100):
        m.num_batches_tracked.fill_(n)
        seen.append(tuple(float(v) for v in m.limits()))
    assert seen == [(1.0, 0.0), (1.0, 0.0), (1.5, 2.5), (2.0, 5.0), (3.0, 5.0), (3.0, 5.0)]


def test_simulated_ranks_renormalize_each_against_its_own_statistics():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 4, 1),
                          nn.BatchNorm2d(4)).double()
    ref = copy.deepcopy(model)
    sim = SimulatedDDP(bnlab.convert(model, "brn", r_max=2.0, d_max=1.0, **RAMPED), 4)
    x = torch.randn(8, 3, 7, 7, dtype=torch.float64) * 2 + 1
    ranks = [bnlab.convert(copy.deepcopy(ref), "brn", r_max=2.0, d_max=1.0, **RAMPED)
             for _ in range(4)]
    for step in range(3):  # after the first step the ranks' running statistics differ
        xs = x + step
        y = sim(xs)
        want = torch.cat([r(xs[2 * i:2 * i + 2]) for i, r in enumerate(ranks)])
        torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-12)
        for i, r in enumerate(ranks):
            for name, buf in sim.rank_buffers(i).items():
                torch.testing.assert_close(buf, r.get_buffer(name), rtol=1e-10, atol=1e-12)
        for r in ranks[1:]:  # DDP's buffer sync before the next forward: rank 0's
            r.load_state_dict(ranks[0].state_dict())


def test_brn_refuses_a_layer_without_running_statistics_and_bad_limits():
    m = BatchRenorm(4, track_running_stats=False)
    with pytest.raises(BnlabError, match="track_running_stats"):
        m(torch.randn(2, 4, 3, 3))
    with pytest.raises(BnlabError, match="r_max >= 1"):
        BatchRenorm(4, r_max=0.5)


def test_evonorm_equals_timms_layer_outputs_and_gradients():
    timm_layers = pytest.importorskip("timm.layers")
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(16)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    ours = bnlab.convert(nn.Sequential(bn), "evonorm", groups=4)[0]
    assert isinstance(ours, EvoNormS0) and ours.groups == 4
    with torch.no_grad():
        ours.v.uniform_(0.5, 1.5)
    ref = timm_layers.EvoNorm2dS0(16, groups=4, eps=bn.eps)
    ref.load_state_dict(ours.state_dict())
    for shape in ((3, 16, 5, 5), (2, 16, 1, 1)):  # a 1x1 map too: resnet18's last stage at 32 px
        side_by_side(ours, ref, torch.randn(shape) * 2 + 0.5, 1e-5, 1e-6)
        for (n, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
            p.grad, q.grad = None, None


def test_evonorm_takes_bns_affine_needs_no_batch_and_caps_its_groups():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    with torch.no_grad():
        model[1].weight.fill_(2.0)
    conv = bnlab.convert(model, "evonorm")  # 32 groups capped at the layer's 8 channels
    assert conv[1].groups == 8 and torch.equal(conv[1].weight, torch.full((8,), 2.0))
    x = torch.randn(4, 3, 6, 6)
    alone = torch.cat([conv(x[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(conv(x), alone)  # each sample on its own: no batch statistics
    assert bnlab.revert(conv)[1] is conv[1]  # nothing to give back
    with pytest.raises(BnlabError, match="does not divide the 8 channels"):
        bnlab.convert(nn.Sequential(nn.BatchNorm2d(8)), "evonorm", groups=3, cap_groups=False)


# ----------------------------------------------------------------------------------------
# The ramp as fractions of the run (norm.ramp_of_run): r and d active for most of any run

PAPER = {"hold": 1 / 32, "r_ramp": 0.25, "d_ramp": 5 / 32}  # 5k, 40k, 25k of 160k steps


@pytest.mark.parametrize("total", [1000, 6360])
def test_a_ramp_of_the_run_reaches_its_limits_at_the_same_share_of_any_length(total):
    from bnlab.batchnorm import set_run_length
    from bnlab.models import resnet20

    m = bnlab.convert(resnet20(), "brn", r_max=1.5, d_max=0.5, ramp_of_run=PAPER)
    steps = set_run_length(m, total)
    assert steps == {"hold_steps": round(total / 32), "r_ramp_steps": round(total / 4),
                     "d_ramp_steps": round(total * 5 / 32)}
    brn = m.layers[0].bn1

    def at(step: int) -> tuple[float, float]:
        brn.num_batches_tracked.fill_(step)
        return tuple(float(v) for v in brn.limits())

    assert at(0) == (1.0, 0.0)  # plain BN at the start, as the paper holds it
    r, d = at(steps["hold_steps"] + steps["r_ramp_steps"] // 2)  # halfway up r's ramp
    assert r == pytest.approx(1.25, abs=0.01) and d > 0.25
    assert at(total // 2) == (1.5, 0.5)  # the middle: both at their limits
    assert at(total) == (1.5, 0.5)  # and the end


def test_without_a_ramp_of_the_run_the_steps_stay_as_given():
    from bnlab.batchnorm import set_run_length
    from bnlab.models import resnet20

    m = bnlab.convert(resnet20(), "brn")
    assert set_run_length(m, 1000) is None and m.layers[0].bn1.hold_steps == 5000


# ----------------------------------------------------------------------------------------
# torch.compile: the ramp read on the device, not the host


def test_the_limits_equal_the_float_formula_to_the_bit_at_every_step():
    m = layer(r_max=3.0, d_max=5.0, hold_steps=7, r_ramp_steps=13, d_ramp_steps=0)
    for n in range(0, 30):
        m.num_batches_tracked.fill_(n)
        done = n - 7
        share = min(1.0, max(0.0, done / 13))
        r, d = m.limits()
        assert float(r) == 1 + 2.0 * share and float(d) == 5.0 * float(done >= 0)


def test_brn_compiles_without_a_graph_break_and_does_not_recompile_as_its_ramp_moves():
    import torch._dynamo as dynamo
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    m = layer(c=4, dtype=torch.float32, hold_steps=1, r_ramp_steps=4, d_ramp_steps=3).train()
    x = torch.randn(8, 4, 3, 3)
    assert dynamo.explain(m)(x).graph_break_count == 0
    dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(m, backend=counter, fullgraph=True)
    eager = copy.deepcopy(m)
    for step in range(6):  # through the hold, both ramps and past them
        y = torch.randn(8, 4, 3, 3) + step
        torch.testing.assert_close(compiled(y), eager(y), rtol=0, atol=0)
    assert counter.frame_count == 1  # one graph for every step of the ramp
