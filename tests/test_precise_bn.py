"""PreciseBN: direct statistics, identical across gloo ranks, pooled vs averaged, no changes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn

import bnlab
from bnlab import dist
from bnlab.batchnorm import RankBatchNorm
from bnlab.errors import BnlabError
from bnlab.metrics import read_jsonl
from bnlab.norms import convert
from bnlab.precise_bn import recalibrate
from conftest import SMOKE, needs_cifar, run_dirs, run_entry


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.Conv2d(4, 5, 3, stride=2, padding=1), nn.BatchNorm2d(5), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 10))
    return convert(m, "bn")


def _images(n=64) -> torch.Tensor:
    """Noise plus a per-image brightness, so images (and small batches) differ in mean."""
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 3, 32, 32, generator=g) + 2 * torch.randn(n, 1, 1, 1, generator=g)


def _stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.double()
    return x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=True)


def _close(a, b, what):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64),
                               rtol=1e-5, atol=1e-6, err_msg=what)


def test_train_estimator_equals_statistics_computed_directly():
    model, x = _model(), _images()
    seen = {}
    hooks = [m.register_forward_pre_hook(lambda mod, inp, i=i: seen.__setitem__(i, inp[0]))
             for i, m in ((1, model[1]), (4, model[4]))]
    model.train()
    with torch.no_grad():
        model(x)  # one batch of everything: what the train estimator sees with batch = 64
    for h in hooks:
        h.remove()
    fresh = _model()
    recalibrate(fresh, lambda: [x], "train")
    for i in (1, 4):
        mean, var = _stats(seen[i])
        _close(fresh[i].running_mean, mean, f"layer {i} mean")
        _close(fresh[i].running_var, var, f"layer {i} var")


def test_eval_estimator_equals_statistics_computed_directly():
    model, x = _model(), _images()
    recalibrate(model, lambda: x.split(16), "eval")
    with torch.no_grad():
        h1 = model[0](x)
        _close(model[1].running_mean, _stats(h1)[0], "layer 1 mean")
        _close(model[1].running_var, _stats(h1)[1], "layer 1 var")
        model.eval()
        h2 = model[3](model[2](model[1](h1)))  # layer 1 already recalibrated, in eval mode
        _close(model[4].running_mean, _stats(h2)[0], "layer 4 mean")
        _close(model[4].running_var, _stats(h2)[1], "layer 4 var")


def test_pooled_does_not_depend_on_batch_size_but_averaged_does():
    x = _images(128)
    out = {}
    for pooling in ("pooled", "averaged"):
        for batch in (2, 64):
            out[pooling, batch] = recalibrate(_model(), lambda b=batch: x.split(b), "eval",
                                              pooling)["1"][1]
    _close(out["pooled", 2], out["pooled", 64], "pooled variance, batch 2 vs 64")
    # The average of per-batch variances drops the spread of the batch means: far lower at 2.
    ratio = (out["averaged", 2] / out["averaged", 64]).mean().item()
    assert ratio < 0.9, ratio


def test_no_parameter_or_optimizer_state_changes():
    model, x = _model(), _images()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.functional.cross_entropy(model(x), torch.zeros(64, dtype=torch.long)).backward()
    opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    state = {k: v["momentum_buffer"].clone() for k, v in opt.state.items()}
    nbt = model[1].num_batches_tracked.clone()
    model.eval()
    for estimator in ("train", "eval"):
        recalibrate(model, lambda: x.split(8), estimator)
        assert not model.training and not model[1].training  # modes restored
    assert all(torch.equal(a, p) for a, p in zip(params, model.parameters(), strict=True))
    assert all(torch.equal(state[k], v["momentum_buffer"]) for k, v in opt.state.items())
    assert torch.equal(model[1].num_batches_tracked, nbt)


def _rank_body(env, estimator: str) -> dict:
    x = _images()
    share = x.chunk(env.world)[env.rank]
    stats = recalibrate(_model(), lambda: share.split(8), estimator)
    return {k: (m.numpy(), v.numpy()) for k, (m, v) in stats.items()}


def _diagnose_batches(rank: int | None = None) -> list:
    """8 batches of (images, labels), 4 a rank; every rank's (the union) for rank None."""
    x, y = _images(), torch.arange(64) % 10
    batches = list(zip(x.split(8), y.split(8), strict=True))
    return batches if rank is None else batches[4 * rank:4 * rank + 4]


def _offset_stats(model: nn.Module, rank: int, share: int | None) -> dict:
    """Rank `rank`'s running statistics: PreciseBN's of the union (from its `share` under a
    process group, which reduces them; from every batch in one process), the means moved by
    0.5 x rank."""
    recalibrate(model, lambda: [b[0] for b in _diagnose_batches(share)], "train")
    for m in model.modules():
        if isinstance(m, RankBatchNorm):
            m.running_mean.add_(0.5 * rank)
    return {n: (m.running_mean.clone(), m.running_var.clone())
            for n, m in model.named_modules() if isinstance(m, RankBatchNorm)}


def _diagnose_body(env) -> dict:
    """bnlab.diagnose under torchrun: a DDP model whose ranks hold different statistics (set
    after wrapping: DDP broadcasts rank 0's buffers when it wraps), each rank its own batches."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(_model())
    _offset_stats(ddp.module, env.rank, env.rank)
    report = bnlab.diagnose(ddp, _diagnose_batches(env.rank), num_samples=32, per_rank=True)
    return json.loads(json.dumps(report.to_json()))


def _two_ranks_worker(jobs: dict) -> dict:
    """Every job (name -> body and its arguments) on this rank of one 2-process gloo group:
    one launch serves every test below (each launch costs seconds)."""
    env = dist.init("cpu", "gloo", threads=1)
    out = {name: body(env, *args) for name, (body, args) in jobs.items()}
    dist.teardown()
    return out


@pytest.fixture(scope="module")
def two_ranks() -> dict:
    """name -> each gloo rank's result, from one launch of 2 processes; the refusal last."""
    jobs = {f"recalibrate {e}": (_rank_body, (e,)) for e in ("train", "eval")}
    jobs.update({f"precise_bn {k}": (_public_body, ([40, 24], k)) for k in ("bn", "syncbn")})
    jobs["precise_bn, a rank without batches"] = (_public_body, ([16, 0], "bn"))
    jobs["diagnose"] = (_diagnose_body, ())
    res = dist.launch_local(_two_ranks_worker, 2, jobs)
    return {name: [r[name] for r in res] for name in jobs}


@pytest.mark.parametrize("estimator", ["train", "eval"])
def test_two_gloo_ranks_hold_identical_statistics_of_the_union(estimator, two_ranks):
    res = two_ranks[f"recalibrate {estimator}"]
    single = recalibrate(_model(), lambda: _images().split(8), estimator)
    for layer, (mean, var) in single.items():
        for r in res:
            _close(r[layer][0], mean, f"{estimator} layer {layer} mean")
            _close(r[layer][1], var, f"{estimator} layer {layer} var")


def test_diagnose_under_torchrun_reads_every_rank_s_batches_and_statistics(two_ranks):
    """Each rank's report is the same, and what one process gives on the union of the ranks'
    batches with the ranks' statistics passed in."""
    a, b = two_ranks["diagnose"]
    ranks = [_offset_stats(_model(), r, None) for r in (0, 1)]
    model = _model()
    _offset_stats(model, 0, None)  # rank 0's model
    one = bnlab.diagnose(model, _diagnose_batches(), num_samples=64, rank_stats=ranks,
                         per_rank=True)
    for key in ("running", "precise", "by_rank", "rank_average", "ranks", "world", "verdict"):
        assert a[key] == pytest.approx(b[key]), key  # what every rank reads: the same
    for key in ("precise", "by_rank", "rank_average", "ranks", "world"):
        assert a[key] == pytest.approx(getattr(one, key)), key
    # with the running statistics each rank evaluates its own share with its own statistics
    right = 0
    for r in (0, 1):
        m = _model()
        _offset_stats(m, r, None)
        with torch.no_grad():
            right += sum(int((m.eval()(x).argmax(1) == y).sum())
                         for x, y in _diagnose_batches(r))
    assert a["running"] == pytest.approx(100 * right / 64)
    assert a["samples"] == 32 and a["world"] == 2 and len(a["by_rank"]) == 2
    assert min(a["ranks"].values()) > 0
    # each rank's layer table is its own statistics against the population: rank 0's sit on it
    assert a["layers"] == [pytest.approx(vars(g)) for g in one.layers]
    assert a["layers"][0]["mean_shift"] < 1e-6 < b["layers"][0]["mean_shift"]
    assert a["by_rank"][0] != a["by_rank"][1]  # the offset statistics do change the metric


@pytest.mark.slow  # CI time (18 s); make test-slow runs it
@needs_cifar
def test_trainer_logs_precise_bn_next_to_val_acc(tmp_path):
    r = run_entry("train.py", *SMOKE, f"output_dir={tmp_path}", "precise_bn=end",
                  "precise_bn.mode=measure", "precise_bn.num_samples=128",
                  "precise_bn.estimator=eval", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (d,) = run_dirs(tmp_path)
    (row,) = [x for x in read_jsonl(d / "metrics.jsonl") if "val/acc_precise" in x]
    assert row["precise_bn/samples"] == 128 and row["time/precise_bn_s"] > 0
    assert json.loads((d / "status.json").read_text())["status"] == "completed"


# ----------------------------------------------------------------------------------------
# bnlab.precise_bn: any model, any iterable of batches


class _Net(nn.Module):
    """A conv BN trunk, dropout (random draws) and a BatchNorm1d head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                   nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.5))
        self.head = nn.Sequential(nn.Linear(16, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))

    def forward(self, x):
        return self.head(self.trunk(x))


def _loader(x: torch.Tensor, batch: int):
    data = torch.utils.data.TensorDataset(x, torch.zeros(len(x), dtype=torch.long))
    return torch.utils.data.DataLoader(data, batch_size=batch)


def test_precise_bn_on_tuples_equals_the_population_statistics_of_the_first_layer():
    x = _images(96)
    model = _Net()
    stats = bnlab.precise_bn(model, _loader(x, 16), num_samples=80)  # 5 batches of 16
    with torch.no_grad():
        mean, var = _stats(model.trunk[0](x[:80]))
    _close(stats["trunk.1"][0], mean, "mean")
    _close(stats["trunk.1"][1], var, "var")
    _close(model.trunk[1].running_var, var, "the layer holds them")
    assert set(stats) == {"trunk.1", "head.1"}


def test_dicts_need_input_fn_and_give_what_tensors_give():
    x = _images(64)
    dicts = [{"image": b, "label": 0} for b in x.split(8)]
    with pytest.raises(BnlabError, match="a batch is a dict.*input_fn=lambda b: b\\['image'\\]"):
        bnlab.precise_bn(_Net(), dicts)
    a = bnlab.precise_bn(_Net(), dicts, input_fn=lambda b: b["image"], estimator="eval")
    b = bnlab.precise_bn(_Net(), iter(x.split(8)))  # a one-shot iterator: train estimator
    c = bnlab.precise_bn(_Net(), x.split(8), estimator="eval")
    for name in a:
        _close(a[name][1], c[name][1], f"{name}: dicts and tensors")
    _close(b["trunk.1"][1], c["trunk.1"][1], "train and eval agree on the first layer")


def test_averaged_pooling_equals_torch_swa_update_bn():
    x = _images(64)
    ours, theirs = _Net(), _Net()
    for m in (ours, theirs):
        m.trunk[5] = nn.Identity()  # no dropout: each draws its masks in its own order
    bnlab.precise_bn(ours, _loader(x, 4), num_samples=None, pooling="averaged")
    torch.optim.swa_utils.update_bn(_loader(x, 4), theirs)
    for a, b in ((ours.trunk[1], theirs.trunk[1]), (ours.head[1], theirs.head[1])):
        _close(a.running_mean, b.running_mean, "mean")
        _close(a.running_var, b.running_var, "var")


def test_only_bn_statistics_change_modes_and_random_state_kept():
    model = _Net()
    model.trunk.eval()  # mixed modes must come back as they were
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    bnlab.precise_bn(model, _images(32).split(8))
    assert torch.equal(torch.get_rng_state(), rng)
    shuffled = torch.utils.data.DataLoader(_images(32), batch_size=8, shuffle=True)
    bnlab.precise_bn(model, shuffled)  # starting a DataLoader draws a seed: inside the fork
    assert torch.equal(torch.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == modes
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"trunk.1.running_mean", "trunk.1.running_var",
                       "head.1.running_mean", "head.1.running_var"}


def test_half_models_sum_squares_in_fp32():
    x = _images(64) * 8 + 40  # fp16 squares of these sum past 65504
    bn = nn.Sequential(nn.BatchNorm2d(3)).half()
    mean, var = bnlab.precise_bn(bn, [x.half()])["0"]
    ref_mean, ref_var = _stats(x.half().float())
    _close(mean, ref_mean, "mean")
    np.testing.assert_allclose(var.double().numpy(), ref_var.numpy(), rtol=2e-3)


def test_frozen_bn_keeps_its_asked_mode_through_precise_bn_and_revert():
    model = bnlab.convert(_Net(), "frozen_bn").train()
    bnlab.precise_bn(model, _images(32).split(8), estimator="eval")
    assert bnlab.revert(model).trunk[1].training  # the model was training


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(self.bn(x)))


def test_bad_input_is_one_sentence():
    x = _images(16)
    with pytest.raises(BnlabError, match="BN layer 'bn' is called 2 times in one forward pass"):
        bnlab.precise_bn(_Twice(), [x])
    with pytest.raises(BnlabError, match="generator or iterator can be read only once"):
        bnlab.precise_bn(_Net(), iter([x]), estimator="eval")
    with pytest.raises(BnlabError, match="estimator='exact' is unknown"):
        bnlab.precise_bn(_Net(), [x], estimator="exact")
    with pytest.raises(BnlabError, match="gave no batch"):
        bnlab.precise_bn(_Net(), [])


def _public_body(env, sizes, kind) -> dict:
    x = _images(sum(sizes))
    share = x[sum(sizes[:env.rank]):sum(sizes[:env.rank + 1])]  # unequal shares
    model = bnlab.convert(_Net(), kind)  # syncbn: 5 batches on one rank, 3 on the other
    try:
        stats = bnlab.precise_bn(model, _loader(share, 8), num_samples=None)
    except BnlabError as e:
        return {"error": str(e)}
    assert all(m.sync == ("exact" if kind == "syncbn" else "none")
               for m in model.modules() if isinstance(m, RankBatchNorm))
    return {k: (m.numpy(), v.numpy()) for k, (m, v) in stats.items()}


def test_a_rank_without_batches_makes_every_rank_refuse(two_ranks):
    res = two_ranks["precise_bn, a rank without batches"]
    assert all("a rank's batches gave no batch" in r["error"] for r in res)


@pytest.mark.parametrize("kind", ["bn", "syncbn"])
def test_precise_bn_on_two_gloo_ranks_gives_each_the_union(kind, two_ranks):
    res = two_ranks[f"precise_bn {kind}"]
    x = _images(64)
    with torch.no_grad():
        mean, var = _stats(_Net().trunk[0](x))
    for r in res:
        _close(r["trunk.1"][0], mean, "mean of the union")
        _close(r["trunk.1"][1], var, "var of the union")
    _close(res[0]["head.1"][1], res[1]["head.1"][1], "later layers identical on both ranks")


@pytest.mark.parametrize("sizes", [[16] * 5, [16, 16, 16, 16, 8, 8]], ids=["equal", "unequal"])
def test_pooled_equals_fvcore_update_bn_stats_up_to_bessels_correction(sizes):
    """fvcore's PreciseBN (update_bn_stats, its population estimator) pools batches weighted
    by size, as bnlab's pooled estimator does; it keeps the population variance (divided by
    N, the values per channel), bnlab the unbiased one (N - 1), as torch's running_var does."""
    from fvcore.nn.precise_bn import update_bn_stats

    x = _images(80)
    ours, theirs = _Net(), _Net()
    for m in (ours, theirs):
        m.trunk[5] = nn.Identity()  # no dropout: each draws its masks in its own order
    batches = list(torch.split(x, sizes))
    bnlab.precise_bn(ours, batches, num_samples=None, pooling="pooled")
    update_bn_stats(theirs, batches, num_iters=len(batches))
    for a, b, n in ((ours.trunk[1], theirs.trunk[1], 80 * 32 * 32),
                    (ours.head[1], theirs.head[1], 80)):
        _close(a.running_mean, b.running_mean, "mean")
        _close(a.running_var, b.running_var * n / (n - 1), "var")
    assert not torch.allclose(ours.head[1].running_var, theirs.head[1].running_var, rtol=1e-3)
