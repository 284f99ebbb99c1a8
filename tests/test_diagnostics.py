"""BN health diagnostics and evaluate.py (its checkpoint table and its offline diagnosis)."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from bnlab import dist
from bnlab.batchnorm import RankBatchNorm
from bnlab.diagnostics import GapProbe, divergence, rank_running_stats
from bnlab.diagnostics import train_mode_accuracy as tm_acc
from bnlab.doctor import bn_value_counts
from bnlab.jitter import MISSING
from bnlab.models import build_model
from bnlab.norms import convert
from conftest import SMOKE, needs_cifar, run_dirs, run_entry, run_here


def test_divergence_is_relative_to_rank0():
    m0, v0 = torch.tensor([0.0, 1.0]), torch.tensor([4.0, 1.0])
    ranks = [{"a": (m0, v0)},
             {"a": (torch.tensor([1.0, 1.0]), torch.tensor([4.0, math.e]))},
             {"a": (torch.tensor([-3.0, 1.5]), torch.tensor([4.0, 1.0]))}]
    d = divergence(ranks)
    assert d["bn/div_mean/a"] == pytest.approx(3 / 2, rel=1e-4)  # |-3 - 0| / sqrt(4)
    assert d["bn/div_logvar/a"] == pytest.approx(1.0, rel=1e-4)
    assert d["bn/div_mean_max"] == d["bn/div_mean/a"]
    # reduce (the average of the variances) misses the spread of the rank means, per channel:
    # channel 0: spread 78/27 of a pooled 4 + 78/27; channel 1: 1/18 of (2 + e) / 3 + 1/18
    gap = (78 / 27 / (4 + 78 / 27) + (1 / 18) / ((2 + math.e) / 3 + 1 / 18)) / 2
    assert d["bn/reduce_var_gap/a"] == pytest.approx(gap, rel=1e-6)
    assert divergence(ranks[:1]) == {}


def _gather_worker() -> list:
    env = dist.init("cpu", "gloo", threads=1)
    model = convert(build_model("resnet20"), "bn")
    for m in model.modules():
        if hasattr(m, "running_mean"):
            m.running_mean.fill_(env.rank + 1.0)
            m.running_var.fill_(10.0 * (env.rank + 1))
    stats = rank_running_stats(model, env)
    dist.teardown()
    return [{n: (a.numpy(), b.numpy()) for n, (a, b) in s.items()} for s in stats]


@pytest.mark.slow  # CI time (15 s); make test-slow runs it
def test_rank_running_stats_gathers_every_rank():
    res = dist.launch_local(_gather_worker, 2)
    for stats in res:  # every rank receives all ranks' statistics, in rank order
        assert len(stats) == 2
        for r, s in enumerate(stats):
            assert len(s) == 19 + 2  # resnet20's BN layers, shortcut BNs included
            for mean, var in s.values():
                assert np.all(mean == r + 1) and np.all(var == 10 * (r + 1))


def test_gap_probe_compares_batch_and_running_statistics():
    torch.manual_seed(0)
    model = convert(build_model("resnet20"), "bn")
    model.train()
    x = torch.randn(4, 3, 32, 32) * 3 + 2
    with GapProbe(model) as probe:
        model(x)
    h = model.conv1(x).detach()  # bn1 sees this; its running stats were still 0 / 1
    expected = (h.mean((0, 2, 3)).abs() / math.sqrt(1 + 1e-5)).max().item()
    gaps = probe.result()
    assert gaps["bn/gap_mean/bn1"] == pytest.approx(expected, rel=1e-4)
    assert gaps["bn/gap_mean_max"] >= expected


def test_train_mode_accuracy_leaves_the_model_alone():
    from bnlab.data import Dataset, make_synthetic

    train, val = make_synthetic(num_train=16, num_val=40)
    data = Dataset(train, val, (0.5,) * 3, (0.25,) * 3)
    model = convert(build_model("resnet20"), "bn").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    env = dist.DistEnv(0, 1, 0, torch.device("cpu"), None)
    res = tm_acc(model, data, val, env, 8)
    assert 0 <= res["bn/train_mode/acc"] <= 100
    assert not model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_train_mode_accuracy_in_one_pass_equals_one_batch_at_a_time():
    from bnlab.data import Dataset, make_synthetic, val_batches

    train, val = make_synthetic(num_train=16, num_val=43)
    data = Dataset(train, val, (0.5,) * 3, (0.25,) * 3)
    model = convert(build_model("resnet20"), "bn")
    model.train()
    for _ in range(3):  # running statistics that differ from any batch's
        model(torch.randn(8, 3, 32, 32) * 2 + 1)
    env = dist.DistEnv(0, 1, 0, torch.device("cpu"), None)
    for batch in (2, 8):  # 8: a last group of 3 (43 = 5 x 8 + 3); 2: a lone last image
        preds = []
        res = tm_acc(model, data, val, env, batch, preds, eval_batch=16)
        ref, meter = copy.deepcopy(model).train(), []  # plain train mode, one batch at a time
        for bn in ref.modules():
            if isinstance(bn, RankBatchNorm):
                bn.sync = "none"
        with torch.no_grad():
            for x, y in val_batches(data, val, env.device, batch, 1, 0):
                if x.shape[0] > 1:
                    meter.append((ref(x).argmax(1), y))
        got = torch.cat(preds)
        want = torch.cat([p for p, _ in meter])
        assert got[: len(want)].tolist() == want.tolist()
        assert got[len(want):].tolist() == [MISSING] * (43 - len(want))  # the lone last image
        acc = 100 * sum(int((p == y).sum()) for p, y in meter) / len(want)
        assert res["bn/train_mode/acc"] == pytest.approx(acc)


def test_values_per_channel_and_risk():
    """The doctor's rule on values alone (images per rank above its threshold): resnet18 at 2
    images per rank is at risk in layer3 and layer4 (fewer than 16 values per channel)."""
    from bnlab import doctor

    counts = bn_value_counts(build_model("resnet18"), 2)
    layers = doctor.measure(build_model("resnet18"), (3, 32, 32), 1, 2, None, 0, 16, 1)
    risky = {layer.name for layer in layers if layer.at_risk}
    assert risky == {n for n in counts if n.startswith("layer4") or n.startswith("layer3")}
    assert {layer.name: layer.normalized_over for layer in layers} == counts


@pytest.mark.slow  # CI time (25 s); make test-slow runs it
def test_the_doctor_mode_lists_layers_at_risk_without_a_checkpoint(tmp_path):
    args = ["doctor.enabled=true", "doctor.model=resnet18", "doctor.world=4",
            "doctor.batch_per_gpu=2"]
    r = run_here("evaluate.py", *args, cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # the doctor's status: layers at risk
    assert "| layer4.1.bn2 | bn | 512 | 2 | 2 | 2 | yes |" in r.stdout
    assert ("syncbn with --sync-group 2 gives 4 samples a group; no group gives layer4.0.bn1 "
            "16 values per channel (it gets 4)") in r.stdout  # the doctor's 4 samples
    r = run_here("evaluate.py", *args, "doctor.norm=syncbn", cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # layer4 still at risk: 8 values per channel
    assert "| layer4.1.bn2 | syncbn | 512 | 2 | 8 | 8 | yes |" in r.stdout


@pytest.mark.parametrize("content", [None, b"not a checkpoint", b"\x80\x02truncated"])
def test_evaluate_refuses_missing_or_corrupt_checkpoints(tmp_path, content):
    path = tmp_path / "checkpoint.pt"
    if content is not None:
        path.write_bytes(content)
    r = run_here("evaluate.py", f"run={path}", cwd=tmp_path)
    assert r.returncode == 2
    assert "bnlab: error: checkpoint:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow  # CI time: evaluate.py is checked by test_train's evaluate test
@needs_cifar
def test_evaluate_a_simulated_four_rank_run(tmp_path):
    r = run_entry("train.py", *SMOKE, f"output_dir={tmp_path}/out", "dist.simulate=4",
                  "batch_per_gpu=4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (d,) = run_dirs(tmp_path)
    rows = [x for x in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
            if "val/acc" in x]
    for k in ("bn/div_mean_max", "bn/div_logvar_max", "bn/gap_mean_max", "bn/train_mode/acc"):
        assert k in rows[-1], k
    r = run_entry("evaluate.py", f"run={d}", "precise_bn_samples=128", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    acc = json.loads((d / "eval.json").read_text())["val_acc"]
    # C10: in eval mode the evaluation batch size does not matter.
    assert acc["eval mode, batch 1"] == acc["eval mode, batch 8"] == acc["eval mode, batch 256"]
    assert acc["rank 0 running statistics"] == acc["eval mode, batch 256"]
    assert {f"rank {r} running statistics" for r in range(4)} <= set(acc)
    for k in ("train mode, batch 2", "average of the ranks' statistics",
              "PreciseBN (train estimator)", "PreciseBN (eval estimator)"):
        assert 0 <= acc[k] <= 100, k
    assert rows[-1]["val/acc"] == pytest.approx(acc["eval mode, batch 256"], abs=1e-9)
    # The ranks' average (bnlab.diagnose's row) against the checkpoint's statistics averaged
    # here and loaded by hand
    import copy

    from bnlab.evaluation import load_trained
    from bnlab.precise_bn import set_running_stats

    run = load_trained(d)
    ranks, m = run.state["rank_bn_stats"], copy.deepcopy(run.model)
    for name, bn in m.named_modules():
        if name in ranks[0]:
            set_running_stats(bn, *(sum(r[name][i] for r in ranks) / len(ranks) for i in (0, 1)))
    assert run.acc(m) == pytest.approx(acc["average of the ranks' statistics"], abs=1e-9)
    # `python -m bnlab diagnose --per-rank` on the run gives evaluate.py's rows
    from bnlab.__main__ import main

    main(["diagnose", "--model", str(d), "--num-samples", "128", "--per-rank", "--json",
          str(tmp_path / "d.json")])
    out = json.loads((tmp_path / "d.json").read_text())
    assert out["by_rank"] == pytest.approx([acc[f"rank {r} running statistics"]
                                            for r in range(4)], abs=1e-9)
    assert out["rank_average"] == pytest.approx(acc["average of the ranks' statistics"], abs=1e-9)


@pytest.mark.parametrize("epoch, step_in_epoch, frozen", [(1, 0, False), (1, 3, True),
                                                         (2, 0, True)])
def test_a_loaded_run_keeps_frozen_bn_as_training_left_it(tmp_path, epoch, step_in_epoch,
                                                          frozen):
    """Frozen BN's freeze is no buffer: a checkpoint of `norm.freeze_after=1` loads frozen
    once a step of epoch 1 (0-based) trained, else as the plain BN of epoch 0."""
    import yaml

    from bnlab import checkpoint
    from bnlab.batchnorm import FrozenBatchNorm
    from bnlab.evaluation import load_trained
    from bnlab.lab.spec import compose
    from bnlab.net import build_net

    cfg = compose(["model=resnet20", "data=synthetic", "data.num_train=16", "data.num_val=16",
                   "norm=frozen_bn", "norm.freeze_after=1"])
    checkpoint.save(tmp_path / checkpoint.CHECKPOINT, {
        "model": build_net(cfg).state_dict(), "epoch": epoch, "step": 7,
        "config": yaml.safe_dump(cfg), "resume": {"epoch": epoch, "step_in_epoch": step_in_epoch}})
    model = load_trained(tmp_path).model.train()
    layers = [m for m in model.modules() if isinstance(m, FrozenBatchNorm)]
    assert layers and all(m.frozen is frozen and m.training is not frozen for m in layers)
