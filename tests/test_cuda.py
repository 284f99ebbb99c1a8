"""The CUDA path (`make test-gpu`): skipped where no CUDA device is visible.

On one GPU a process group has one rank, so SyncBN's sync functions are called directly on a
world-1 NCCL group (the forward of a syncbn layer skips them at world 1), and the simulation's
grouped statistics stand in for several ranks. Two-GPU NCCL runs need a second GPU.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F

from bnlab.batchnorm import RankBatchNorm
from bnlab.norms import convert
from bnlab.simulate import SimulatedDDP, simulate
from bnlab.syncbn import sync_batch_norm, syncbn_impl, torch_sync_batch_norm
from conftest import SMOKE, needs_cifar, run_dirs, run_entry

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]
IMPLS = {"torch": torch_sync_batch_norm, "bnlab": sync_batch_norm}


@pytest.fixture(scope="module")
def nccl_world_1():
    """A one-rank NCCL process group on GPU 0."""
    store = tdist.HashStore()
    tdist.init_process_group("nccl", store=store, rank=0, world_size=1,
                             device_id=torch.device("cuda", 0))
    yield
    tdist.destroy_process_group()


def reference(x: torch.Tensor, c: int) -> nn.BatchNorm2d:
    """torch's BatchNorm for the whole batch (cumulative running statistics), on x's device,
    with weight and bias away from 1 and 0."""
    bn = nn.BatchNorm2d(c, momentum=None).to(x.device)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_both_syncbn_implementations_equal_bn_on_the_batch(nccl_world_1, impl, layout):
    torch.manual_seed(0)
    x = torch.randn(8, 16, 8, 8, device="cuda") * 3 + 1
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    ref = reference(x, 16)
    ours = RankBatchNorm(16, sync="exact", momentum=None).cuda()
    ours.load_state_dict(ref.state_dict())
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya = ref(xa)
    yb = IMPLS[impl](xb, ours, None)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    torch.testing.assert_close(yb, ya, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-5, atol=1e-6)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_both_syncbn_implementations_under_bf16_autocast(nccl_world_1, impl):
    torch.manual_seed(1)
    x = torch.randn(8, 16, 8, 8, device="cuda")
    ref = reference(x, 16)
    ours = RankBatchNorm(16, sync="exact", momentum=None).cuda()
    ours.load_state_dict(ref.state_dict())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = IMPLS[impl](x.to(torch.bfloat16), ours, None)
    torch.testing.assert_close(y.float(), ref(x), rtol=2e-2, atol=2e-2)


def test_the_simulation_on_cuda_equals_cpu_in_float64():
    """4 simulated ranks x 2 of syncbn in groups of 2, and bn: outputs, gradients and every
    rank's running statistics agree between CPU and CUDA to float64 precision."""
    from bnlab.models import build_model

    outs = {}
    for device in ("cpu", "cuda"):
        for kind, opts in (("bn", {}), ("syncbn", {"sync_group": 2})):
            torch.manual_seed(0)
            net = SimulatedDDP(convert(build_model("resnet20"), kind, **opts), 4)
            net = net.double().to(device)
            x = torch.randn(8, 3, 32, 32, dtype=torch.float64, generator=torch.Generator()
                            .manual_seed(1)).to(device)
            y = net(x)
            y.square().sum().backward()
            bufs = {n: b.detach().cpu() for n, b in net.named_buffers()}
            grads = {n: p.grad.detach().cpu() for n, p in net.named_parameters()}
            outs[device, kind] = (y.detach().cpu(), grads, bufs)
    for kind in ("bn", "syncbn"):
        (ya, ga, ba), (yb, gb, bb) = outs["cpu", kind], outs["cuda", kind]
        torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-10)
        for n in ga:
            torch.testing.assert_close(gb[n], ga[n], rtol=1e-8, atol=1e-10, msg=n)
        for n in ba:
            torch.testing.assert_close(bb[n], ba[n], rtol=1e-10, atol=1e-10, msg=n)


def test_the_simulations_grouped_statistics_on_cuda_equal_bn_per_group():
    """syncbn over groups of 2 of 4 simulated ranks on CUDA: each group's samples are
    normalized by torch's BN on that group's concatenation."""
    torch.manual_seed(2)
    x = torch.randn(8, 4, 5, 5, device="cuda")
    layer = simulate(RankBatchNorm(4, sync="exact", sync_group=2).cuda(), 4)
    y = layer(x)
    for g in range(2):
        part = x[4 * g:4 * (g + 1)]
        ref = F.batch_norm(part, None, None, training=True, eps=layer.eps)
        torch.testing.assert_close(y[4 * g:4 * (g + 1)], ref, rtol=1e-5, atol=1e-5)


def test_auto_picks_torchs_kernels_on_cuda_and_bnlabs_on_cpu():
    assert syncbn_impl("auto", "cuda") == "torch" and syncbn_impl("bnlab", "cuda") == "bnlab"
    assert syncbn_impl("auto", "cpu") == "bnlab"


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL)")


@needs_cifar
@pytest.mark.parametrize("args, impl", [
    ([], None),  # one rank syncs with nobody: plain BN runs, and run.json says so
    (["dist.simulate=2"], "bnlab"),  # the simulation is bnlab's on any device
    pytest.param(["dist.nproc_per_node=2"], "torch", marks=TWO_GPUS),
    pytest.param(["dist.nproc_per_node=2", "norm.impl=bnlab"], "bnlab", marks=TWO_GPUS),
], ids=["one-gpu", "simulated", "two-gpus-auto", "two-gpus-bnlab"])
def test_train_py_runs_syncbn_on_cuda_and_records_which_implementation(tmp_path, args, impl):
    r = run_entry("train.py", *SMOKE, f"output_dir={tmp_path}/out", "dist.device=cuda",
                  "norm=syncbn", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (d,) = run_dirs(tmp_path)
    info = json.loads((d / "run.json").read_text())
    assert info["device"].startswith("cuda") and info["syncbn_impl"] == impl
    assert json.loads((d / "status.json").read_text())["status"] == "completed"


# -- precision and channels_last on CUDA -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind,opts,share", [("bn", {}, 1), ("syncbn", {"sync_group": 2}, 2)])
def test_simulated_norms_under_cuda_autocast_equal_torchs_batchnorm_per_group(kind, opts, share,
                                                                               dtype):
    """4 simulated ranks x 2 at 1x1 maps under CUDA autocast: torch's BatchNorm2d on each
    group's samples under the same autocast (outputs, input gradient, running statistics in
    float32)."""
    import copy

    torch.manual_seed(0)
    x = torch.randn(8, 16, 1, 1, device="cuda") * 3 + 1
    g = torch.randn_like(x)
    bn = reference(x, 16)
    bn.momentum = 0.1
    sim = SimulatedDDP(convert(copy.deepcopy(bn), kind, **opts), 4)
    xi, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    refs = [copy.deepcopy(bn) for _ in range(4 // share)]
    n = 8 // len(refs)
    with torch.autocast("cuda", dtype=dtype):
        y = sim(xi.to(dtype))
        yr = torch.cat([r(xr[j * n:(j + 1) * n].to(dtype)) for j, r in enumerate(refs)])
    y.float().backward(g)
    yr.float().backward(g)
    assert sim.module.running_var.dtype == torch.float32
    torch.testing.assert_close(y.float(), yr.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(xi.grad, xr.grad, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(sim.module.running_mean, refs[0].running_mean)
    torch.testing.assert_close(sim.module.running_var, refs[0].running_var)


@needs_cifar
@pytest.mark.parametrize("args", [["precision=bf16", "channels_last=true"],
                                  ["precision=fp16", "norm=syncbn"]], ids=["bf16-cl", "fp16"])
def test_train_py_trains_in_mixed_precision_on_cuda(tmp_path, args):
    """A short simulated 4 x 2 run in bf16 (channels-last) and fp16 (with its gradient scaler,
    whose state the checkpoint keeps) completes on CUDA with a finite loss."""
    r = run_entry("train.py", *SMOKE, f"output_dir={tmp_path}/out", "dist.device=cuda",
                  "dist.simulate=4", "batch_per_gpu=2", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (d,) = run_dirs(tmp_path)
    assert json.loads((d / "status.json").read_text())["status"] == "completed"
    ckpt = torch.load(d / "checkpoint.pt", weights_only=True)
    assert bool(ckpt["scaler"]) == ("precision=fp16" in args)


@needs_cifar
def test_an_fp16_run_resumes_with_its_loss_scale(tmp_path):
    """An fp16 run stopped by max_steps and extended from its checkpoint goes on with the
    scaler's state it saved (its scale and growth tracker), and completes."""
    args = [*SMOKE, "dist.device=cuda", "dist.simulate=4", "batch_per_gpu=2",
            "precision=fp16", f"hydra.run.dir={tmp_path / 'r'}"]
    r = run_entry("train.py", *args, "max_steps=4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    saved = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)["scaler"]
    assert saved and saved["scale"] > 0
    r = run_entry("train.py", *args, "max_steps=0", cwd=tmp_path)
    assert r.returncode == 0 and "resuming" in r.stdout, r.stderr[-3000:]
    after = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)["scaler"]
    assert after["scale"] > 0 and set(after) == set(saved)
