"""Exact SyncBN against torch's BatchNorm on the concatenated batch (the oracle), on gloo."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn

from bnlab import dist
from bnlab.batchnorm import RankBatchNorm
from bnlab.errors import BnlabError

C = 5


def _global_batch(sizes, seed=0):
    """Input and upstream gradient for all ranks; rank r's samples get an offset of r."""
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x = torch.randn(n, C, 3, 3, generator=g) * 2
    owner = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    x += owner.view(-1, 1, 1, 1).float() * 1.5  # per-rank means differ, as with skewed data
    return x, torch.randn(n, C, 3, 3, generator=g)


def _affine(bn: nn.Module) -> None:
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 2.0, C))
        bn.bias.copy_(torch.linspace(-1.0, 1.0, C))


def _chunk(t, sizes, r):
    start = sum(sizes[:r])
    return t[start:start + sizes[r]]


def _np(d: dict) -> dict:
    return {k: v.detach().numpy().copy() for k, v in d.items()}


def _sync_body(env, sizes, sync, group, momentum, dtype=None):
    bn = RankBatchNorm(C, sync, group, momentum=momentum)
    _affine(bn)
    x, gy = _global_batch(sizes)
    x = _chunk(x, sizes, env.rank).clone().requires_grad_(True)
    if dtype is not None:
        with torch.autocast("cpu", dtype=dtype):
            y = bn(x.to(dtype))
    else:
        y = bn(x)
    (y.float() * _chunk(gy, sizes, env.rank)).sum().backward()
    out = {"y": y.float(), "dx": x.grad, "dw": bn.weight.grad, "db": bn.bias.grad,
           "rm": bn.running_mean, "rv": bn.running_var,
           "nbt": bn.num_batches_tracked.float().view(1)}
    bn.eval()
    out["y_eval"] = bn(x.detach())
    return _np(out)


def _process_group_body(env, sizes):
    """syncbn through `convert(..., process_group=)`: ranks {0, 2} and {1, 3} share statistics
    (groups of ranks that are not consecutive, as torch's convert_sync_batchnorm takes)."""
    import torch.distributed as tdist

    import bnlab

    groups = [tdist.new_group([0, 2]), tdist.new_group([1, 3])]  # every rank makes both
    bn = bnlab.convert(nn.Sequential(nn.BatchNorm2d(C)), "syncbn",
                       process_group=groups[env.rank % 2])[0]
    _affine(bn)
    x, gy = _global_batch(sizes)
    x = _chunk(x, sizes, env.rank).clone().requires_grad_(True)
    y = bn(x)
    (y * _chunk(gy, sizes, env.rank)).sum().backward()
    return _np({"y": y, "dx": x.grad, "rv": bn.running_var, "rm": bn.running_mean,
                "size": torch.tensor([float(bn.group_size(env.world))])})


def _ranks_worker(jobs: dict) -> dict:
    """Every job (name -> body and its arguments) on this rank of one gloo process group:
    one launch of W processes serves every test at W ranks (each launch costs seconds)."""
    env = dist.init("cpu", "gloo", threads=1)
    out = {name: body(env, *args) for name, (body, args) in jobs.items()}
    dist.teardown()
    return out


def _jobs(world: int) -> dict:
    """What the tests below compute at `world` ranks, by name."""
    sizes = {2: [[4, 4], [0, 0]], 4: [[3, 1, 5, 2], [3, 0, 4, 2]]}[world]
    jobs = {f"exact {s}": (_sync_body, (s, "exact", 0, 0.1)) for s in sizes}
    jobs[f"naive {[3] * world}"] = (_sync_body, ([3] * world, "naive", 0, 1.0))
    jobs[f"exact {[3] * world} momentum 1"] = (_sync_body, ([3] * world, "exact", 0, 1.0))
    if world == 2:
        jobs["bf16"] = (_sync_body, ([4, 4], "exact", 0, 1.0, torch.bfloat16))
        jobs.update({f"layout {k}": (_layout_body, ([3, 5], k)) for k in TOLERANCE})
    else:
        jobs["groups of 2"] = (_sync_body, ([2, 3, 1, 2], "exact", 2, 0.1))
        jobs["process groups"] = (_process_group_body, ([2, 3, 1, 2],))
    return jobs


@pytest.fixture(scope="module")
def ranks():
    """ranks(W)[name]: each rank's result of job `name`, from one launch per W."""
    done: dict[int, dict] = {}

    def get(world: int) -> dict:
        if world not in done:
            res = dist.launch_local(_ranks_worker, world, _jobs(world))
            done[world] = {name: [r[name] for r in res] for name in res[0]}
        return done[world]

    return get


def _reference(sizes, lo=0, hi=None, momentum=0.1):
    bn = nn.BatchNorm2d(C, momentum=momentum)
    _affine(bn)
    x, gy = _global_batch(sizes)
    start, stop = sum(sizes[:lo]), sum(sizes[:hi] if hi is not None else sizes)
    x = x[start:stop].clone().requires_grad_(True)
    y = bn(x)
    (y * gy[start:stop]).sum().backward()
    bn.eval()
    return bn, x, y, bn(x.detach())


def _close(a, b, what):
    np.testing.assert_allclose(a, b.detach().numpy() if torch.is_tensor(b) else b,
                               rtol=1e-5, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("sizes", [[4, 4], [3, 1, 5, 2], [3, 0, 4, 2], [0, 0]],
                         ids=["equal-2", "unequal-4", "empty-rank-4", "all-empty-2"])
def test_syncbn_equals_batchnorm_on_the_concatenated_batch(sizes, ranks):
    res = ranks(len(sizes))[f"exact {sizes}"]
    bn, x, y, y_eval = _reference(sizes)
    for r, out in enumerate(res):
        _close(out["y"], _chunk(y, sizes, r), f"output rank {r}")
        _close(out["dx"], _chunk(x.grad, sizes, r), f"input grad rank {r}")
        _close(out["rm"], bn.running_mean, "running mean")
        _close(out["rv"], bn.running_var, "running var (unbiased, global count)")
        _close(out["nbt"], [1.0], "num_batches_tracked")
        _close(out["y_eval"], _chunk(y_eval, sizes, r), f"eval output rank {r}")
    # Weight and bias gradients: each rank holds its share; DDP's all-reduce adds them up.
    _close(sum(o["dw"] for o in res), bn.weight.grad, "weight grad")
    _close(sum(o["db"] for o in res), bn.bias.grad, "bias grad")


def test_sync_groups_share_statistics_within_groups_of_k_ranks(ranks):
    sizes = [2, 3, 1, 2]
    res = ranks(4)["groups of 2"]
    for lo, hi in [(0, 2), (2, 4)]:
        bn, x, y, _ = _reference(sizes, lo, hi)
        for r in range(lo, hi):
            _close(res[r]["y"], _chunk(y, sizes[lo:hi], r - lo), f"output rank {r}")
            _close(res[r]["dx"], _chunk(x.grad, sizes[lo:hi], r - lo), f"input grad rank {r}")
            _close(res[r]["rv"], bn.running_var, f"running var rank {r}")


def test_a_torch_process_group_of_any_ranks_shares_statistics_among_them(ranks):
    sizes = [2, 3, 1, 2]
    res = ranks(4)["process groups"]
    x, gy = _global_batch(sizes)
    for members in ((0, 2), (1, 3)):
        xs = torch.cat([_chunk(x, sizes, r) for r in members]).requires_grad_(True)
        bn = nn.BatchNorm2d(C)
        _affine(bn)
        y = bn(xs)
        (y * torch.cat([_chunk(gy, sizes, r) for r in members])).sum().backward()
        lo = 0
        for r in members:
            n = sizes[r]
            _close(res[r]["y"], y[lo:lo + n], f"output rank {r}")
            _close(res[r]["dx"], xs.grad[lo:lo + n], f"input grad rank {r}")
            _close(res[r]["rm"], bn.running_mean, f"running mean rank {r}")
            _close(res[r]["rv"], bn.running_var, f"running var rank {r}")
            _close(res[r]["size"], [2.0], "the doctor's group size")
            lo += n


def test_statistics_stay_fp32_under_bf16_autocast(ranks):
    sizes = [4, 4]
    res = ranks(2)["bf16"]
    x, _ = _global_batch(sizes)
    xb = x.to(torch.bfloat16).float()  # the values the layer saw, exactly, in fp32
    mean = xb.mean((0, 2, 3))
    var = xb.var((0, 2, 3), unbiased=True)
    for out in res:
        _close(out["rm"], mean, "running mean from bf16 input, merged in fp32")
        _close(out["rv"], var, "running var from bf16 input, merged in fp32")


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_naive_sync_variance_misses_exactly_the_spread_of_rank_means(world, ranks):
    """C12: mean_r(var_r) = var_union - mean_r((mean_r - mean)^2), for equal counts."""
    sizes = [3] * world
    naive = ranks(world)[f"naive {sizes}"][0]
    exact = ranks(world)[f"exact {sizes} momentum 1"][0]
    n_rank, n_all = 3 * 9, world * 3 * 9  # values per channel: per rank, in the union
    var_naive = naive["rv"] * (n_rank - 1) / n_rank  # biased variance the naive layer used
    var_true = exact["rv"] * (n_all - 1) / n_all
    x, _ = _global_batch(sizes)
    means = torch.stack([_chunk(x, sizes, r).mean((0, 2, 3)) for r in range(world)])
    spread = (means - means.mean(0)).pow(2).mean(0).numpy()
    assert spread.mean() > 0.3 and (spread > 0.01).all()  # rank offsets make the bias large
    np.testing.assert_allclose(var_true - var_naive, spread, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(naive["rm"], exact["rm"], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------
# Inputs users have: memory layouts, half types, torch.compile


def _layout_input(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "noncontiguous":  # a transposed view: same values, strides of another shape
        return x.transpose(2, 3).contiguous().transpose(2, 3)
    if layout == "half_model":
        return x.half()
    return x


def _layout_body(env, sizes, layout):
    bn = RankBatchNorm(C, "exact", 0, momentum=1.0)
    _affine(bn)
    if layout == "half_model":
        bn.half()
    x, gy = _global_batch(sizes)
    x = _layout_input(_chunk(x, sizes, env.rank), layout).detach().requires_grad_(True)
    assert layout not in ("channels_last", "noncontiguous") or not x.is_contiguous()
    if layout in ("bf16_autocast", "fp16_autocast"):
        dtype = torch.bfloat16 if layout == "bf16_autocast" else torch.float16
        with torch.autocast("cpu", dtype=dtype):
            y = bn(x.to(dtype))
    else:
        y = bn(x)
    (y.float() * _chunk(gy, sizes, env.rank)).sum().backward()
    return _np({"y": y.float(), "dx": x.grad.float(), "rm": bn.running_mean.float(),
                "rv": bn.running_var.float()})


TOLERANCE = {"channels_last": 1e-5, "noncontiguous": 1e-5, "half_model": 2e-3,
             "fp16_autocast": 2e-3, "bf16_autocast": 2e-2}


@pytest.mark.parametrize("layout", list(TOLERANCE))
def test_syncbn_is_exact_for_layouts_and_half_types(layout, ranks):
    sizes = [3, 5]
    res = ranks(2)[f"layout {layout}"]
    x, gy = _global_batch(sizes)
    if layout != "channels_last" and layout != "noncontiguous":  # the values the layer saw
        x = x.to(torch.bfloat16 if layout == "bf16_autocast" else torch.float16).float()
    bn = nn.BatchNorm2d(C, momentum=1.0)
    _affine(bn)
    x = x.clone().requires_grad_(True)
    y = bn(x)
    (y * gy).sum().backward()
    tol = TOLERANCE[layout]
    for r, out in enumerate(res):
        for key, ref in (("y", _chunk(y, sizes, r)), ("dx", _chunk(x.grad, sizes, r))):
            np.testing.assert_allclose(out[key], ref.detach().numpy(), rtol=tol, atol=tol,
                                       err_msg=f"{layout} {key} rank {r}")
        np.testing.assert_allclose(out["rm"], bn.running_mean.numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(out["rv"], bn.running_var.numpy(), rtol=tol, atol=tol)


def _compile_worker(sizes):
    env = dist.init("cpu", "gloo", threads=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(C, C, 3, padding=1), RankBatchNorm(C, "exact"), nn.ReLU())
    x, gy = _global_batch(sizes)
    x, gy = _chunk(x, sizes, env.rank), _chunk(gy, sizes, env.rank)
    out = {}
    for name, net in (("eager", copy.deepcopy(model)), ("compiled", torch.compile(model))):
        y = net(x)
        (y * gy).sum().backward()
        weight_grad = net[0].weight.grad if name == "eager" else model[0].weight.grad
        out[name] = {"y": y.detach().numpy().copy(), "dw": weight_grad.numpy().copy()}
    dist.teardown()
    return out


@pytest.mark.slow  # CI time (about 30 s: compiling); make test-slow runs it
def test_torch_compile_runs_syncbn_with_the_same_results():
    """It may graph-break at the collectives; it must not crash or change results."""
    res = dist.launch_local(_compile_worker, 2, [3, 5])
    for out in res:
        np.testing.assert_allclose(out["compiled"]["y"], out["eager"]["y"], rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(out["compiled"]["dw"], out["eager"]["dw"], rtol=1e-4,
                                   atol=1e-5)


def test_exact_syncbn_runs_torchs_kernels_only_on_cuda_and_run_json_says_whose():
    from types import SimpleNamespace

    from bnlab.syncbn import syncbn_impl
    from bnlab.trainer import ran_syncbn

    assert syncbn_impl("auto", "cpu") == syncbn_impl("bnlab", "cuda") == "bnlab"
    assert syncbn_impl("auto", "cuda") == syncbn_impl("torch", "cuda:1") == "torch"
    with pytest.raises(BnlabError, match="norm.impl=torch needs CUDA"):
        syncbn_impl("torch", "cpu")
    cfg = {"norm": {"kind": "syncbn", "impl": "auto"}}
    cpu = SimpleNamespace(device=torch.device("cpu"), world=2)
    gpu = SimpleNamespace(device="cuda:0", world=2)
    assert ran_syncbn(cfg, cpu, 1) == "bnlab" and ran_syncbn(cfg, gpu, 1) == "torch"
    assert ran_syncbn(cfg, gpu, 4) == "bnlab"  # the simulation is bnlab's on any device
    assert ran_syncbn({"norm": {"kind": "bn"}}, gpu, 1) is None
    one = SimpleNamespace(device="cuda:0", world=1)
    assert ran_syncbn(cfg, one, 1) is None  # one rank syncs with nobody: plain BN runs
    assert ran_syncbn(cfg, one, 4) == "bnlab"
