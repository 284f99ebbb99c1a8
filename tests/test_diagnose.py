"""bnlab.diagnose and `python -m bnlab diagnose` on models users have: the caller's model left
alone, a planted fault named first, the statistics' cost against PreciseBN, the CLI's exits."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
import torchvision

import bnlab
from bnlab.errors import BnlabError


def batches(n: int = 6, size: int = 16, seed: int = 0) -> list:
    """(images, labels) batches whose labels a small net can read off the mean colour."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        y = torch.randint(0, 4, (size,), generator=g)
        x = torch.randn(size, 3, 16, 16, generator=g) + y.view(-1, 1, 1, 1).float()
        out.append((x, y))
    return out


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


def settled(model: nn.Module, data: list) -> nn.Module:
    """Running statistics that are the population's: what a well trained model holds."""
    bnlab.precise_bn(model, data, None)
    return model.eval()


def test_the_callers_model_rng_and_modes_are_left_as_they_were():
    model, data = small_net(), batches()
    model[1].eval()  # a mixed state: one BN layer in eval mode, the rest training
    before = copy.deepcopy(model.state_dict())
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    report = bnlab.diagnose(model, data, batch_per_rank=2, num_samples=64)
    assert torch.equal(torch.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == modes
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert report.samples == 64 and set(report.precise) == {"train", "eval"}
    assert all(g.at_risk for g in report.layers)  # 2 images: the doctor's rule flags them


def test_a_planted_fault_is_named_first_and_costs_accuracy():
    data = batches()
    model = settled(torchvision.models.resnet18(num_classes=4), data)
    clean = bnlab.diagnose(model, data, num_samples=96)
    assert abs(clean.cost) < 1e-9 and clean.layers[0].worst < 1e-3  # nothing to recover
    assert clean.verdict().startswith("BN's statistics are not the problem")
    with torch.no_grad():
        model.layer2[0].bn1.running_var.mul_(10)
    report = bnlab.diagnose(model, data, num_samples=96)
    assert report.layers[0].name == "layer2.0.bn1"
    assert report.layers[0].log_var == pytest.approx(torch.log(torch.tensor(10.0)).item(),
                                                     abs=1e-4)
    assert report.layers[1].worst < 1e-3
    assert report.precise["train"] == pytest.approx(clean.running)  # PreciseBN undoes it


def test_the_train_mode_row_normalizes_each_run_of_the_training_batch_on_its_own():
    model, data = settled(small_net(), batches()), batches()
    seen = []
    report = bnlab.diagnose(model, data, num_samples=32, batch_per_rank=4,
                            evaluate=lambda m: seen.append(m) or 0.0)
    x = data[0][0]
    m = seen[-1]  # the copy the train-mode row measured
    want = torch.cat([small_net_bn_on(model, x[i:i + 4]) for i in range(0, 16, 4)])
    torch.testing.assert_close(m[:2](x), want)
    assert report.train_mode == 0.0 and report.batch_per_rank == 4


def small_net_bn_on(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The first conv and BN of `model`, BN on `x`'s own statistics."""
    bn = model[1]
    return nn.functional.batch_norm(model[0](x), None, None, bn.weight, bn.bias, True, 0.0,
                                    bn.eps)


def test_each_rank_s_statistics_and_their_average_are_measured_where_asked():
    data = batches()
    model = settled(small_net(), data)
    own = {n: (m.running_mean.clone(), m.running_var.clone())
           for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    off = {n: (mean + 3.0, var * 4.0) for n, (mean, var) in own.items()}
    seen = []

    def metric(m):  # the first BN layer's running mean, as the copy measured holds it
        seen.append(m[1].running_mean.clone())
        return float(m[1].running_mean.mean())

    report = bnlab.diagnose(model, data, num_samples=32, evaluate=metric,
                            rank_stats=[own, off], per_rank=True)
    assert report.by_rank == pytest.approx([float(own["1"][0].mean()), float(off["1"][0].mean())])
    assert report.rank_average == pytest.approx(float((own["1"][0] + off["1"][0]).mean() / 2))
    assert report.world == 2 and report.ranks["1"] > 1.0  # 3 of rank 0's sd apart, at least
    assert "| with rank 1's running statistics |" in report.table()
    assert torch.equal(model[1].running_mean, own["1"][0])  # the caller's model untouched
    plain = bnlab.diagnose(model, data, num_samples=32, evaluate=metric, rank_stats=[own, off])
    assert plain.by_rank == [] and "with rank 1's" not in plain.table()
    with pytest.raises(BnlabError, match="per_rank: 1 rank's"):
        bnlab.diagnose(model, data, num_samples=32, rank_stats=[own], per_rank=True)


def test_a_layer_training_keeps_in_eval_mode_keeps_its_running_statistics_in_train_mode():
    class Frozen(nn.BatchNorm2d):  # a user's frozen BN: not bnlab's, no `frozen` attribute
        def train(self, mode=True):
            return super().train(False)

    data = batches()
    model = settled(small_net(), data)
    frozen = Frozen(8)
    frozen.load_state_dict(model[1].state_dict())
    model[1] = frozen.eval()
    seen = []
    bnlab.diagnose(model, data, num_samples=32, batch_per_rank=4,
                   evaluate=lambda m: seen.append(m) or 0.0)
    x = data[0][0]
    m = seen[-1]  # the copy the train-mode row measured
    torch.testing.assert_close(m[:2](x), model[:2].eval()(x))  # the frozen layer: running
    bn = model[4]  # a plain layer: each run of 4 samples on its own statistics
    want = torch.cat([nn.functional.batch_norm(model[:4].eval()(x[i:i + 4]), None, None,
                                               bn.weight, bn.bias, True, 0.0, bn.eps)
                      for i in range(0, 16, 4)])
    torch.testing.assert_close(m[:5](x), want)


def test_bad_input_is_one_sentence():
    with pytest.raises(BnlabError, match="no BatchNorm layer"):
        bnlab.diagnose(nn.Sequential(nn.Linear(2, 2)), [torch.zeros(1, 2)])
    with pytest.raises(BnlabError, match="batches are empty"):
        bnlab.diagnose(small_net(), [])
    with pytest.raises(BnlabError, match="no target"):
        bnlab.diagnose(small_net(), [torch.zeros(4, 3, 8, 8)], num_samples=4)
    with pytest.raises(BnlabError, match="at least 2 samples"):
        bnlab.diagnose(small_net(), batches(), batch_per_rank=1)


def test_the_command_prints_the_table_writes_json_and_exits_by_the_threshold(
        tmp_path, monkeypatch, capsys):
    from bnlab.__main__ import main

    (tmp_path / "mine_cli.py").write_text(
        "import torch, torch.nn as nn\n"
        "def net():\n"
        "    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),\n"
        "                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))\n"
        "def loader():\n"
        "    g = torch.Generator().manual_seed(1)\n"
        "    return [(torch.randn(8, 3, 8, 8, generator=g) * 3 + 2,\n"
        "             torch.randint(0, 3, (8,), generator=g)) for _ in range(4)]\n")
    monkeypatch.chdir(tmp_path)  # the command imports <module>:<function> from here
    monkeypatch.syspath_prepend(str(tmp_path))
    import mine_cli

    torch.save({"model": mine_cli.net().state_dict()}, tmp_path / "ckpt.pt")

    def cli(*args):
        code = main(["diagnose", "--model", "mine_cli:net", "--loader", "mine_cli:loader",
                     *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = cli("--checkpoint", "ckpt.pt", "--batch-per-rank", "2", "--json",
                         "out.json", "--num-samples", "32", "--threshold", "100")
    assert code == 0, err
    report = json.loads((tmp_path / "out.json").read_text())
    assert "| with the running statistics |" in out and report["verdict"] in out
    assert "(python -m bnlab doctor names k)" in out  # the command as this caller runs bnlab
    assert "doctor" not in report  # the JSON holds measurements only
    assert report["cost"] == pytest.approx(report["precise"]["train"] - report["running"])
    below = f"{report['cost'] - 1:g}"  # a threshold under the measured cost: exit 1, the fix
    code, out, _ = cli("--checkpoint", "ckpt.pt", "--num-samples", "32", "--threshold", below)
    assert code == 1 and "recalibrate" in out
    code, _, err = cli("--checkpoint", "nothing.pt")
    assert code == 2 and err.count("\n") == 1 and "does not exist" in err


def test_the_verdicts_first_line_follows_the_measured_cost_as_the_exit_status_does():
    """Below the threshold the verdict says 'not the problem' even where layers are at risk by
    the doctor's rule, which it says on a second line (a 30-epoch run measured +0.79 points and
    exited 0 while its verdict opened 'a problem')."""
    from bnlab.diagnose import Diagnosis, LayerGap

    at_risk = [LayerGap("bn1", 0.1, 0.2, True)]
    low = Diagnosis(70.0, {"train": 70.79}, None, 2, 64, at_risk)
    first, second, third, *evidence = low.verdict().splitlines()
    assert first.startswith("BN's statistics are not the problem here: PreciseBN changes")
    assert "+0.79 points (threshold 1)" in first
    assert second.startswith("Structural risk: 1 of 1 BN layers are at risk at 2 samples")
    assert third.startswith("Or, without per-step communication")  # then its evidence, indented
    assert all(line.startswith("    ") for line in evidence)
    assert max(len(line.split()) for line in (first, second, third)) <= 40
    assert second.endswith("(bnlab doctor names k).")  # the installed command by default
    high = Diagnosis(70.0, {"train": 72.5}, None, 2, 64, at_risk)
    assert high.verdict().startswith("BN's statistics are a problem here: the running "
                                     "statistics cost 2.50 points")
