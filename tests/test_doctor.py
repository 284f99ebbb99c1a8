"""The BN doctor on torchvision's, bnlab's and a user's own models; bad input is exit 2."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from bnlab import checkpoint
from bnlab.__main__ import main
from bnlab.errors import BnlabError
from bnlab.lab import quoted
from bnlab.net import build_net
from conftest import ROOT, run_here

# scenarios written around groups of 8 samples, the default before table-practice's rule
# doctor_change moved it to 4: a user's own --min-images 8
AT_8 = ("--min-images", "8")


def _doctor(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["doctor", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _json(capsys, *args: str) -> tuple[int, dict]:
    code, out, err = _doctor(capsys, *args, "--json")
    assert not err, err
    return code, json.loads(out)


def test_resnet50_at_8_by_2_is_at_risk_in_every_layer_and_syncbn_2_fixes_it(capsys):
    code, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                    "--world", "8", "--batch-per-rank", "2")
    assert code == 1 and r["at_risk"] == 53 == len(r["layers"])
    low = min(r["layers"], key=lambda layer: layer["per_rank"])
    assert low["per_rank"] == 2 * 7 * 7 and low["images"] == 2  # 7x7 in layer4 at 224
    assert r["recommendations"][0].startswith("syncbn with --sync-group 2 (4 samples")
    assert "    table-recover at 4 ranks x 2 on resnet20" in r["recommendations"][0] and \
        "SyncBN in groups of 2 ranks (syncbn2)" in r["recommendations"][0]  # 4 samples too
    assert r["recommendations"][1].startswith("without per-step communication")
    from bnlab import advice  # the group count table-recover measured gn at, where one is

    measured = advice.groups("gn", low["per_rank"])[0]
    assert f"gn with groups={measured or 32} " in r["recommendations"][2]
    code, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                    "--world", "8", "--batch-per-rank", "2", "--norm", "syncbn",
                    "--sync-group", "4")
    assert code == 0 and r["at_risk"] == 0
    assert {layer["images"] for layer in r["layers"]} == {8}


def test_bnlab_resnet18_at_4_by_2_table(capsys):
    code, out, _ = _doctor(capsys, "--model", "bnlab:resnet18", "--world", "4",
                           "--batch-per-rank", "2")
    assert code == 1
    assert "| layer4.1.bn2 | BatchNorm2d | 512 | 2 | 2 | 2 | yes |" in out  # 1x1 maps
    assert "| bn1 | BatchNorm2d | 64 | 512 | 2 | 512 | yes |" in out
    assert ("20 of 20 batch-statistics layers are at risk: 20 by samples (fewest 2, threshold "
            "4), 10 by values per channel (fewest 2, threshold 16).") in out  # the 1x1 and 2x2
    code, out, _ = _doctor(capsys, "--model", "bnlab:resnet18", "--world", "4",
                           "--batch-per-rank", "16")
    assert code == 0 and "| layer3.0.bn1 | BatchNorm2d | 256 | 64 | 16 | 64 |  |" in out
    assert "| layer4.1.bn2 | BatchNorm2d | 512 | 16 | 16 | 16 |  |" in out  # at the threshold


def test_the_report_cites_the_table_that_measures_its_thresholds(capsys):
    from bnlab import doctor
    assert (ROOT / doctor.EVIDENCE).is_file()
    at_4x2 = ("--model", "bnlab:resnet20", "--world", "4", "--batch-per-rank", "2")
    _, out, _ = _doctor(capsys, *at_4x2)
    assert f"{doctor.EVIDENCE} in bnlab's repository)" in out  # table-values, cited
    from bnlab import advice  # then table-practice, which judged them too, last
    practice = json.loads(advice.PRACTICE.read_text())["thresholds"]["table"]
    assert out.rstrip().endswith(f"({practice}).")
    low = f"{doctor.MIN_IMAGES} samples and {doctor.MIN_VALUES} values per channel"
    assert f"{low} (bnlab's defaults)" in out
    _, out, _ = _doctor(capsys, *at_4x2, "--min-values", "4")
    assert (f"4 values per channel (yours; bnlab's defaults are {doctor.MIN_IMAGES} and "
            f"{doctor.MIN_VALUES})") in out
    _, r = _json(capsys, *at_4x2)
    assert r["thresholds_evidence"] == doctor.EVIDENCE
    assert r["thresholds_judged"] in out  # what table-values finds of them, from its file


def test_the_thresholds_line_says_what_table_values_found_or_that_none_judged_them(
        capsys, tmp_path, monkeypatch):
    from bnlab import advice, caveats

    monkeypatch.setattr(caveats, "THRESHOLDS", tmp_path / "thresholds.json")  # none yet
    monkeypatch.setattr(advice, "PRACTICE", tmp_path / "practice.json")  # none yet
    at_4x2 = ("--model", "bnlab:resnet20", "--world", "4", "--batch-per-rank", "2")
    _, out, _ = _doctor(capsys, *at_4x2)
    assert "on CIFAR-10, no table has judged them yet (make table-values" in out
    (tmp_path / "thresholds.json").write_text(json.dumps({"table": "T", "at": [
        {"global_batch": 8, "answer": "not supported (a reason)"},
        {"global_batch": 16, "answer": "supported"}]}))
    _, out, _ = _doctor(capsys, *at_4x2)
    assert out.rstrip().endswith("table-values finds them not supported (a reason) at global "
                                 "batch 8; supported at global batch 16 (T).")
    (tmp_path / "practice.json").write_text(json.dumps({"thresholds": {
        "answer": "not supported (bn holds at 8 x 4)", "global_batches": "16 to 128",
        "judged": {"images": 8, "values": 16}, "change": 4, "table": "P"}}))
    monkeypatch.setattr(caveats, "MIN_IMAGES", 8)  # doctor_change gives 4, not yet committed
    monkeypatch.setattr(caveats, "MIN_VALUES", 16)
    _, out, _ = _doctor(capsys, *at_4x2)
    assert out.rstrip().endswith("; table-practice finds them not supported (bn holds at 8 x 4) "
                                 "at global batches 16 to 128; by its rule doctor_change "
                                 "MIN_IMAGES moves to 4 (P).")
    monkeypatch.setattr(caveats, "MIN_IMAGES", 4)  # as after the commit that makes the change
    assert caveats.thresholds_judged().endswith(
        "; table-practice finds 8 images and 16 values not supported (bn holds at 8 x 4) at "
        "global batches 16 to 128; by its rule doctor_change MIN_IMAGES is now 4 (P)")


FACTORY = '''
import torch.nn as nn

class BatchNormAct2d(nn.BatchNorm2d):
    def forward(self, x):
        return super().forward(x).relu()

def build():
    return nn.Sequential(nn.Conv2d(3, 12, 3), nn.BatchNorm2d(12), nn.GroupNorm(4, 12),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(12, 6),
                         nn.BatchNorm1d(6))

def fused():
    return nn.Sequential(nn.Conv2d(3, 4, 1), BatchNormAct2d(4))

def broken():
    raise RuntimeError("no weights here")
'''


@pytest.fixture
def factory_dir(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("mymodels", None)


def test_a_factory_model_with_group_norm_and_a_batchnorm1d_head(capsys, factory_dir):
    code, r = _json(capsys, "--model", "mymodels:build", "--input", "3x10x10", "--world", "2",
                    "--batch-per-rank", "8")
    layers = {layer["name"]: layer for layer in r["layers"]}
    assert layers["1"]["per_rank"] == 8 * 8 * 8 and not layers["1"]["at_risk"]
    assert layers["2"]["kind"] == "GroupNorm" and layers["2"]["per_rank"] == 3 * 8 * 8
    assert not layers["2"]["batch_dependent"]
    assert layers["6"]["per_rank"] == 8 and layers["6"]["at_risk"]  # 8 values < 16
    assert code == 1 and r["at_risk"] == 1
    assert "gn with groups=6" in r["recommendations"][2]  # divides 12 and 6


def test_a_bnlab_checkpoint(capsys, tmp_path):
    cfg = {"seed": 0, "model": {"name": "resnet20"},
           "norm": {"kind": "syncbn", "eps": 1e-5, "momentum": 0.1, "sync_group": 2}}
    path = tmp_path / "checkpoint.pt"
    checkpoint.save(path, {"config": yaml.safe_dump(cfg),
                           "model": build_net(cfg).state_dict()})
    code, r = _json(capsys, "--model", str(path), "--world", "4", "--batch-per-rank", "2")
    assert r["input"] == "3x32x32" and r["layers"][0]["kind"] == "syncbn"
    assert {layer["images"] for layer in r["layers"]} == {4}  # the run's sync groups of 2
    assert code == 0  # 4 samples and 256 or more values a group: at the thresholds, not under
    code, r = _json(capsys, "--model", str(path), "--world", "4", "--batch-per-rank", "1")
    assert code == 1 and {layer["images"] for layer in r["layers"]} == {2}


@pytest.mark.parametrize("args, message", [
    (["--model", "nope"], "is neither torchvision:<name>"),
    (["--model", "torchvision:resnet51"], "torchvision has no model 'resnet51'"),
    (["--model", "bnlab:resnet19"], "bnlab has no model 'resnet19'"),
    (["--model", "nomodule_here:build"], "importing 'nomodule_here' failed"),
    (["--model", "mymodels:broken"], "calling broken() failed (RuntimeError: no weights here)"),
    (["--model", "mymodels:build", "--input", "5x10x10"],
     "the model does not take an input of shape (1, 5, 10, 10)"),
    (["--model", "mymodels:build", "--input", "3by10"], "--input '3by10' is not a shape"),
    (["--model", "mymodels:fused", "--input", "3x4x4", "--norm", "syncbn"],
     "layer '1' is a BatchNormAct2d, a BatchNorm subclass with its own forward"),
    (["--model", "mymodels:build", "--world", "4", "--sync-group", "3", "--norm", "syncbn"],
     "--sync-group 3 does not divide --world 4; give a divisor of 4 (1, 2, 4)."),
    (["--model", "mymodels:build", "--world", "4", "--sync-group", "-2", "--norm", "syncbn"],
     "--sync-group must be a positive integer, got -2."),
    (["--model", "mymodels:build", "--world", "4", "--sync-group", "2"],
     "--sync-group 2 applies to --norm syncbn only; add --norm syncbn, or leave --sync-group "
     "out."),
    (["--model", str(ROOT / "README.md") + ".pt"], "does not exist"),
])
def test_bad_input_is_one_sentence_and_exit_2(capsys, factory_dir, args, message):
    code, out, err = _doctor(capsys, *args)
    assert code == 2 and not out
    assert err.startswith("bnlab: error: ") and message in err and err.count("\n") == 1


def test_python_m_bnlab_doctor_runs_as_a_command(tmp_path):
    import re
    import subprocess
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "bnlab", "doctor", "--model",
                        "bnlab:resnet20", "--world", "4", "--batch-per-rank", "16"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "No layer at risk" in r.stdout
    # resnet20 (and the trainer's warning, which measures it the same way) never imports
    # torchvision: its ops import torch._dynamo, seconds in every process
    assert re.search(r"\|\s+torch$", r.stderr, re.M) and "torchvision" not in r.stderr


def test_torchvisions_frozen_batchnorm_is_a_norm_layer():
    import torch.nn as nn
    from torchvision.ops.misc import FrozenBatchNorm2d

    from bnlab.doctor import _norm_layers

    m = nn.Sequential(nn.Conv2d(3, 4, 3), FrozenBatchNorm2d(4))
    assert list(_norm_layers(m).values()) == ["1"]


def test_layers_outside_batch_statistics_are_listed_not_flagged(capsys, factory_dir):
    _, out, _ = _doctor(capsys, "--model", "mymodels:build", "--input", "3x10x10")
    assert "| 2 | GroupNorm | 12 | 192 (per sample) | 1 (each alone) | 192 |  |" in out


def test_the_outputs_quoted_in_docs_library_are_current(capsys):
    """make report rewrites them (bnlab/lab/quoted.py); this catches a change that did not."""
    blocks = quoted.quotes()
    assert len(blocks) == 2
    for args, block in blocks:
        _, out, _ = _doctor(capsys, *args.split())
        assert out.rstrip("\n") == block, args


def test_make_report_rewrites_a_stale_quote_with_the_doctor_s_output(tmp_path):
    page = tmp_path / "library.md"
    args = "--model bnlab:resnet18 --world 4 --batch-per-rank 2"
    page.write_text(f"Before.\n<!-- doctor: {args} -->\n```text\nstale\n```\nAfter.\n")
    quoted.refresh(page)
    (got, block), = quoted.quotes(page)
    assert got == args and block == quoted.doctor_output(args) and "stale" not in block
    assert page.read_text().startswith("Before.\n") and page.read_text().endswith("After.\n")
    kept = page.read_text()
    page.write_text(kept + "<!-- doctor: --model bnlab:resnet18 --world 0 -->\n```text\nx\n```\n")
    with pytest.raises(BnlabError, match=r"under `<!-- doctor: --model bnlab:resnet18 --world 0 "
                       r"-->` exited 2 \(bnlab: error: .*\); mend the arguments"):
        quoted.refresh(page)  # a refused doctor: nothing rewritten, the build fails
    assert page.read_text().startswith(kept)
    page.write_text(kept.replace(args, "--no-such-flag"))
    with pytest.raises(BnlabError, match="exited 2"):
        quoted.refresh(page)


def test_the_skip_a_refusal_advises_is_a_doctor_option(capsys, factory_dir):
    """convert() refuses a fused BN subclass and names skip; the doctor takes it as --skip."""
    code, _, err = _doctor(capsys, "--model", "mymodels:fused", "--norm", "syncbn")
    assert code == 2 and "--skip 1" in err
    code, out, _ = _doctor(capsys, "--model", "mymodels:fused", "--norm", "syncbn",
                           "--skip", "1")
    assert code in (0, 1) and "BatchNormAct2d" in out


def test_the_fix_line_names_the_smallest_group_of_8_samples_and_cites_table_recover(
        capsys, tmp_path, monkeypatch):
    """No sync group reaches both thresholds (resnet18 at 32 px, 4 x 2): the line names the
    smallest group with 8 samples and what it still lacks; the line on fixes without
    communication cites table-recover, with its measured best once advice.json is there."""
    from bnlab import advice

    monkeypatch.setattr(advice, "ADVICE", tmp_path / "advice.json")
    monkeypatch.setattr(advice, "PRACTICE", tmp_path / "practice.json")  # none unless written
    monkeypatch.setattr(advice, "LONGER", tmp_path / "converge.json")  # none yet
    code, r = _json(capsys, "--model", "torchvision:resnet18", "--input", "3x32x32",
                    "--world", "4", "--batch-per-rank", "2", *AT_8)
    assert code == 1
    assert r["recommendations"][0] == (
        "syncbn with --sync-group 4 gives 8 samples a group; no group gives layer4.0.bn1 16 "
        "values per channel (it gets 8)")
    assert "not been measured yet (make table-recover" in r["recommendations"][1]
    (tmp_path / "advice.json").write_text(json.dumps({
        "where": "4 ranks x 2 on resnet20 (CIFAR-10)",
        "best": {"fix": "syncbn", "state": "recovers", "gain": 9.0, "share": 0.98, "lo": 0.9,
                 "hi": 1.06},
        "best_free": {"fix": "gn", "name": "GroupNorm", "state": "partly", "gain": 5.0,
                      "share": 0.55, "lo": 0.4, "hi": 0.7}}))
    _, r = _json(capsys, "--model", "torchvision:resnet18", "--input", "3x32x32",
                 "--world", "4", "--batch-per-rank", "2")
    assert r["recommendations"][1] == (
        "without per-step communication: GroupNorm (gn) gets back 55% of BN's loss, partly, on "
        "resnet20\n    table-recover at 4 ranks x 2 on resnet20 (CIFAR-10): GroupNorm (gn) gets "
        "back 55% of BN's loss (95% CI 40 to 70): partly\n    (make table-recover: "
        "experiments/recover/table.md in bnlab's repository)")
    assert r["recommendations"][2].endswith("all BN layers' channels)")  # gn unmeasured
    (tmp_path / "advice.json").write_text(json.dumps({
        "where": "4 ranks x 2 on resnet20 (CIFAR-10)",
        "best_free": {"fix": "precise", "state": "no better", "gain": 1.5, "share": 0.16,
                      "lo": 0.05, "hi": 0.27},
        "fixes": {"gn": {"fix": "gn", "name": "GroupNorm", "state": "no better", "gain": -4.1,
                         "share": -0.45, "lo": -0.6, "hi": -0.3}}}))
    _, r = _json(capsys, "--model", "torchvision:resnet18", "--input", "3x32x32",
                 "--world", "4", "--batch-per-rank", "2")
    assert r["recommendations"][1].startswith(  # the best is no better: the line says so
        "without per-step communication: none did better than BN, on resnet20\n")
    assert r["recommendations"][1].endswith(
        "(CIFAR-10): none did better than BN; the closest, precise gets back 16% of BN's loss "
        "(95% CI 5 to 27): no better\n    (make table-recover: experiments/recover/table.md in "
        "bnlab's repository)")
    assert r["recommendations"][2].endswith(  # the gn line says what the table found for gn
        "dividing all BN layers' channels): ends 4.1 points below BN, no better, on resnet20\n    "
        "table-recover at 4 ranks x 2 on resnet20 (CIFAR-10): GroupNorm (gn) ends 4.1 points "
        "below BN (share of BN's loss recovered -45%, 95% CI -60 to -30): no better")


def _two_inputs(path) -> None:
    """advice.json as table-recover writes it once both inputs are measured: resnet20 (128
    values per channel at the break), where no communication-free fix beats BN, and resnet18 at
    32 px (2 values), where GroupNorm recovers (numbers made up for the test)."""
    gn20 = {"fix": "gn", "name": "GroupNorm", "state": "no better", "gain": -4.6,
            "share": -0.5, "lo": -0.62, "hi": -0.4}
    gn18 = {"fix": "gn", "name": "GroupNorm", "state": "recovers", "gain": 30.0,
            "share": 1.05, "lo": 0.98, "hi": 1.12}
    path.write_text(json.dumps({"inputs": [
        {"input": "resnet20", "values": 128, "where": "4 ranks x 2 on resnet20 (CIFAR-10)",
         "best_free": {"fix": "precise", "name": "BN with PreciseBN every epoch",
                       "state": "no better", "gain": 0.8, "share": 0.09, "lo": 0.01,
                       "hi": 0.21}, "fixes": {"gn": gn20}},
        {"input": "resnet18 32 px", "values": 2,
         "where": "4 ranks x 2 on torchvision resnet18 at 32 px (CIFAR-10)",
         "best_free": gn18, "fixes": {"gn": gn18}}]}))


@pytest.fixture
def two_inputs(tmp_path, monkeypatch):
    """The doctor reading _two_inputs' advice.json, and no longer runs."""
    from bnlab import advice

    monkeypatch.setattr(advice, "ADVICE", tmp_path / "advice.json")
    monkeypatch.setattr(advice, "PRACTICE", tmp_path / "practice.json")  # none unless written
    monkeypatch.setattr(advice, "LONGER", tmp_path / "converge.json")  # none yet
    _two_inputs(tmp_path / "advice.json")


def test_the_fix_lines_cite_the_measured_input_nearest_in_values_per_channel(
        capsys, two_inputs):
    """The seeds' own model (torchvision resnet18 at 32 px, 4 x 2: 2 values per channel in
    layer4) gets resnet18's rows, named, with resnet20's different ranking said; resnet50 at
    224 px, 8 x 2 (98 values in layer4) gets the input nearest it, resnet20 (128), named."""
    _, r = _json(capsys, "--model", "torchvision:resnet18", "--input", "3x32x32",
                 "--world", "4", "--batch-per-rank", "2")
    free, gn = r["recommendations"][1], r["recommendations"][2]
    assert free.startswith(
        "without per-step communication: GroupNorm (gn) gets back 105% of BN's loss, recovers, "
        "on torchvision resnet18 at 32 px (2 values)\n    table-recover at 4 ranks x 2 on "
        "torchvision resnet18 at 32 px (CIFAR-10; 2 values per channel per rank at its smallest "
        "BN layer, the measured input nearest to this model's 2): GroupNorm (gn) gets back 105% "
        "of BN's loss")
    assert "\n    on resnet20 (128 values) it differs: none did better than BN" in free
    assert "table-recover at 4 ranks x 2 on torchvision resnet18 at 32 px" in gn
    assert gn.split("table-recover at ", 1)[1].count("recovers") == 1
    assert "on resnet20 (128 values) it differs: GroupNorm (gn) ends 4.6 points below BN" in gn
    _, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                 "--world", "8", "--batch-per-rank", "2")
    free = r["recommendations"][1]
    assert free.startswith(
        "without per-step communication: none did better than BN, on resnet20 (128 values)\n"
        "    table-recover at 4 ranks x 2 on resnet20 (CIFAR-10; 128 values per channel per "
        "rank at its smallest BN layer, the measured input nearest to this model's 98): none "
        "did better than BN")
    assert "on torchvision resnet18 at 32 px (2 values) it differs: GroupNorm (gn)" in free


def test_the_fix_lines_say_where_the_longer_runs_rank_a_fix_otherwise(
        capsys, tmp_path, monkeypatch):
    """converge.json (table-converge: resnet20 trained 40 epochs): where a fix's state there
    differs from table-recover's on resnet20, its line says so, named; where it agrees, nothing
    is added."""
    from bnlab import advice

    monkeypatch.setattr(advice, "ADVICE", tmp_path / "advice.json")
    monkeypatch.setattr(advice, "PRACTICE", tmp_path / "practice.json")  # none unless written
    monkeypatch.setattr(advice, "LONGER", tmp_path / "converge.json")
    _two_inputs(tmp_path / "advice.json")
    gn = {"fix": "gn", "name": "GroupNorm", "state": "partly", "gain": 3.0, "share": 0.4,
          "lo": 0.2, "hi": 0.6}
    (tmp_path / "converge.json").write_text(json.dumps({
        "input": "resnet20", "epochs": 40, "fixes": {"gn": gn}}))
    _, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                 "--world", "8", "--batch-per-rank", "2")
    free, line = r["recommendations"][1], r["recommendations"][2]
    assert ("\n    on resnet20 trained 40 epochs, not 10, the best of the fixes it trained "
            "without communication (gn) differs: GroupNorm (gn) gets back 40% of BN's loss (95% "
            "CI 20 to 60): partly\n    (make table-recover") in free
    assert line.endswith("\n    on resnet20 trained 40 epochs, not 10 (where it was no better), "
                         "it differs: GroupNorm (gn) gets back 40% of BN's loss (95% CI 20 to "
                         "60): partly")
    (tmp_path / "converge.json").write_text(json.dumps({
        "input": "resnet20", "epochs": 40, "fixes": {"gn": {**gn, "state": "no better"}}}))
    _, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                 "--world", "8", "--batch-per-rank", "2")
    assert "40 epochs" not in r["recommendations"][1] + r["recommendations"][2]
    (tmp_path / "converge.json").write_text(json.dumps({  # a fix it did not train: no clause
        "input": "resnet20", "epochs": 40, "fixes": {"gnws": {**gn, "fix": "gnws"}}}))
    _, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                 "--world", "8", "--batch-per-rank", "2")
    assert "40 epochs" not in r["recommendations"][1] + r["recommendations"][2]
    assert advice.said({**gn, "identical": True}) == (
        "GroupNorm (gn) gets back all of BN's loss (its runs equal the 1 x 8 reference's): partly")
    (tmp_path / "advice.json").write_text(json.dumps({  # advice.json's first form: no input
        "where": "4 ranks x 2 on resnet20 (CIFAR-10)",
        "best_free": {"fix": "gn", "state": "no better", "gain": -1.0},
        "fixes": {"gn": {"fix": "gn", "state": "no better", "gain": -1.0}}}))
    _, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                 "--world", "8", "--batch-per-rank", "2")
    assert "40 epochs" not in r["recommendations"][1] + r["recommendations"][2]


def test_where_no_sync_group_reaches_8_samples_the_line_says_so(capsys):
    """2 ranks x 2: no group of ranks reaches 8 samples; the line names that threshold, not
    the values one (which resnet20's smallest layer clears)."""
    _, r = _json(capsys, "--model", "bnlab:resnet20", "--world", "2", "--batch-per-rank", "2",
                 *AT_8)
    assert r["recommendations"][0].split("; measured: ")[0] == (  # then syncbn at 4 samples
        "syncbn over all 2 ranks gives 4 samples (threshold 8): no sync group reaches it")
    _, r = _json(capsys, "--model", "bnlab:resnet20", "--world", "1", "--batch-per-rank", "2")
    assert r["recommendations"][0].startswith("without per-step communication")  # no sync line


def test_gradient_accumulation_is_named_and_counted_by_the_micro_batch(capsys):
    """--grad-accum k: BN still normalizes each micro-batch of --batch-per-rank; the first fix
    line says so, the others count the micro-batch (Lightning-AI #17446)."""
    code, r = _json(capsys, "--model", "bnlab:resnet20", "--world", "1", "--batch-per-rank",
                    "2", "--grad-accum", "4")
    assert code == 1
    assert r["recommendations"][0].startswith(
        "gradient accumulation (4 micro-batches a step) does not enlarge BN's batch: each "
        "forward normalizes its own micro-batch of 2, not the 8 images per rank")
    _, plain = _json(capsys, "--model", "bnlab:resnet20", "--world", "1", "--batch-per-rank",
                     "2")
    assert r["recommendations"][1:] == plain["recommendations"]


def test_json_has_one_meaning_in_every_command(capsys, tmp_path):
    """--json alone prints JSON instead of the table; --json PATH prints the table and writes
    the JSON there (as bnlab diagnose takes it)."""
    out = tmp_path / "doctor.json"
    code, text, _ = _doctor(capsys, "--model", "bnlab:resnet20", "--world", "4",
                            "--batch-per-rank", "2", "--json", str(out))
    assert code == 1 and f"wrote {out}" in text and not text.lstrip().startswith("{")
    assert json.loads(out.read_text())["at_risk"] > 0


def test_outside_what_bnlab_measured_the_doctor_says_extrapolated_and_shows_the_published_row(
        capsys):
    """The README's own example (resnet50, 224 px, 8 x 2): bnlab measured its fixes on
    CIFAR-10 at 32 px, so its lines are extrapolated; Wu and He measured this very layout, and
    their row is shown as published, not as bnlab's."""
    _, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                 "--world", "8", "--batch-per-rank", "2")
    extrapolated, published = r["notes"]
    assert extrapolated.startswith("extrapolated: bnlab measured these fixes on CIFAR-10 at "
                                   "32 x 32 px, not at this input's 224 x 224")
    assert published.startswith("published, not measured by bnlab: Wu and He 2018")
    assert "BN 34.7% top-1 error against 23.6% at 32 (11.1 points lost)" in published
    assert "GroupNorm 24.1% (24.0 to 24.2 at every batch)" in published
    _, r = _json(capsys, "--model", "bnlab:resnet20", "--input", "3x32x32", "--world", "4",
                 "--batch-per-rank", "2")
    assert r["notes"] == []  # measured there; no published row for CIFAR-10 at 4 x 2


def test_each_fix_line_is_one_sentence_of_40_words_with_its_evidence_indented(capsys):
    """The README's own example: every fix is one line of at most 40 words; what it rests on
    (the table, the input, the interval; published numbers) sits on indented lines under it."""
    _, out, _ = _doctor(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                        "--world", "8", "--batch-per-rank", "2")
    fixes = out.split("Fixes:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    heads = [line for line in fixes if line.startswith("- ")]
    assert len(heads) == 4 and all(len(h.split()) <= 40 for h in heads), heads
    assert all(line.startswith(("- ", "  ")) for line in fixes)
    assert any("table-recover at" in line for line in fixes if line.startswith("    "))


def test_the_start_of_run_warning_is_two_lines_that_name_the_doctor(tmp_path):
    r = run_here("train.py", "model=resnet20", "data=synthetic", "data.num_train=32",
                 "data.num_val=16", "epochs=1", "max_steps=1", "batch_per_gpu=2",
                 "dist.simulate=4", "progress=false", "checkpoint=false",
                 f"output_dir={tmp_path}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stderr.split("bnlab: warning: ", 1)[1].splitlines()
    assert lines[0].startswith("21 of 21 batch-statistics layers are at risk")
    assert lines[1] == ("  the fixes, with their evidence: bnlab doctor --model bnlab:resnet20 "
                        "--input 3x32x32 --world 4 --batch-per-rank 2")
    assert not lines[2:] or not lines[2].startswith("  ")


def test_two_inputs_about_as_near_are_both_cited(capsys, two_inputs):
    """16 values per channel lies as far from resnet18's 2 as from resnet20's 128 (log scale):
    each fix line gives both inputs' results, not the first by list order, in at most 40
    words, with both inputs' evidence under it."""
    _, r = _json(capsys, "--model", "torchvision:mobilenet_v3_small", "--input", "3x64x64",
                 "--world", "2", "--batch-per-rank", "4", *AT_8)  # 4 images: at risk under 8
    free, gn = r["recommendations"][1], r["recommendations"][2]
    for line in (free, gn):
        head, *evidence = line.split("\n")
        assert "on resnet20 (128 values); as near, torchvision resnet18 at 32 px (2 values): " \
            in head
        assert len(head.split()) <= 40
        assert sum(e.startswith("    table-recover at") for e in evidence) == 2
    assert "as near to this model's 16 as the other" in gn


def test_table_practices_row_comes_first_where_it_is_as_near_as_table_recovers(
        capsys, two_inputs, tmp_path):
    """The README's example (resnet50 at 224 px, 8 x 2: 98 values in layer4) is as near
    resnet20 at 8 x 2 (table-practice) as at 4 x 2 (table-recover), both 128 values: by
    table-practice's rule `advice` its row comes first, named with its table, layout, global
    batch and length, and table-recover's stays beside it; the gn line takes table-practice's
    group count; the thresholds line adds what table-practice found (numbers made up)."""
    gnws = {"fix": "gnws", "name": "GroupNorm + WS", "state": "recovers", "gain": 9.0,
            "groups": 16, "share": 0.95, "lo": 0.8, "hi": 1.1}
    (tmp_path / "practice.json").write_text(json.dumps({
        "table": "table-practice", "input": "resnet20", "values": 128, "global_batch": 16,
        "epochs": 120, "where": "8 ranks x 2 on resnet20 (CIFAR-10)", "best": gnws,
        "best_free": gnws, "fixes": {"gnws": gnws, "gn": {**gnws, "fix": "gn",
                                                          "name": "GroupNorm"}},
        "thresholds": {"answer": "supported", "global_batches": "16 to 128", "table": "P"}}))
    code, out, _ = _doctor(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                           "--world", "8", "--batch-per-rank", "2")
    assert code == 1
    free = next(line for line in out.splitlines()
                if line.startswith("- without per-step communication"))
    assert free == ("- without per-step communication: GroupNorm + WS (gnws) gets back 95% of "
                    "BN's loss, recovers, on resnet20, 8 x 2 (128 values)")  # table-recover's
    # row on the same input is evidence only, as the sync-group line's is
    assert len(free.split()) <= 41  # the list's dash, then at most 40 words
    assert ("    table-practice at 8 ranks x 2 on resnet20 (CIFAR-10, global batch 16, 120 "
            "epochs; 128 values per channel per rank at its smallest BN layer, the measured "
            "input nearest to this model's 98): GroupNorm + WS (gnws) gets back 95% of BN's "
            "loss (95% CI 80 to 110): recovers") in out
    assert "\n    table-recover at 4 ranks x 2 on resnet20 (CIFAR-10; 128 values" in out
    assert "\n    on torchvision resnet18 at 32 px (2 values) it differs" in out
    assert "(make table-practice: experiments/practice/table.md in bnlab's repository; make " \
        "table-recover: experiments/recover/table.md in bnlab's repository)" in out
    assert "- gn with groups=16 (table-practice's count; " in out
    assert "; table-practice finds them supported at global batches 16 to 128 (P)" in out


def test_as_near_is_measured_from_the_nearest_input_not_the_one_cited_first():
    """table-practice's row is cited first where it is as near as the nearest input; the
    inputs cited beside it are those as near as that nearest input, not as near as the
    promoted row (which could bring in one farther than TIE from the nearest)."""
    from bnlab.advice import TIE, nearest

    r = {"table": "table-recover", "values": 128}
    p = {"table": "table-practice", "values": round(128 * 2 ** (0.8 * TIE))}  # as near as r
    q = {"table": "table-recover", "values": round(128 * 2 ** (1.4 * TIE))}  # near p, not r
    assert nearest([r, p, q], 128) == (p, [r], [q])
    assert nearest([r, q], 128) == (r, [], [q])
    assert nearest([q, r], None) == (q, [], [r])  # unknown values: the first entry


def test_the_sync_group_line_cites_syncbn_measured_at_as_many_samples_per_group(
        capsys, tmp_path, monkeypatch):
    """The sync-group line gives what the tables measured for SyncBN with the same number of
    samples per statistics group as the group it advises (numbers made up): at 8 x 2 in groups
    of 4, table-practice's syncbn4 first and table-recover's SyncBN over all 4 ranks x 2 (8
    samples too) beside it; at 2 ranks x 2 (4 samples), table-recover's groups of 2; where no
    table measured that many samples per group, nothing is cited."""
    from bnlab import advice

    for name in ("ADVICE", "PRACTICE", "LONGER"):
        monkeypatch.setattr(advice, name, tmp_path / f"{name.lower()}.json")

    def fix(key: str, name: str, state: str, share: float) -> dict:
        return {"fix": key, "name": name, "state": state, "gain": 10 * share,
                "share": share, "lo": share - 0.1, "hi": share + 0.1}

    (tmp_path / "advice.json").write_text(json.dumps({"inputs": [
        {"input": "resnet20", "values": 128, "where": "4 ranks x 2 on resnet20 (CIFAR-10)",
         "fixes": {"syncbn": fix("syncbn", "SyncBN over all 4 ranks", "unclear", 0.84),
                   "syncbn2": fix("syncbn2", "SyncBN in groups of 2 ranks", "partly", 0.64)}},
        {"input": "resnet18 32 px", "values": 2,
         "where": "4 ranks x 2 on torchvision resnet18 at 32 px (CIFAR-10)",
         "fixes": {"syncbn": fix("syncbn", "SyncBN over all 4 ranks", "recovers", 1.01)}}]}))
    (tmp_path / "practice.json").write_text(json.dumps({
        "table": "table-practice", "input": "resnet20", "values": 128, "global_batch": 16,
        "epochs": 120, "where": "8 ranks x 2 on resnet20 (CIFAR-10)",
        "fixes": {"syncbn4": fix("syncbn4", "SyncBN in groups of 4 ranks", "recovers", 0.9)}}))
    _, r = _json(capsys, "--model", "torchvision:resnet50", "--input", "3x224x224",
                 "--world", "8", "--batch-per-rank", "2", *AT_8)
    head, *evidence = r["recommendations"][0].split("\n")
    assert head == ("syncbn with --sync-group 4 (8 samples, at least 392 values per "
                    "channel a group); measured: gets back 90% of BN's loss, recovers, on "
                    "resnet20, 8 x 2 (128 values)")  # 4 x 2, the same input: evidence only
    assert len(head.split()) <= 40
    assert evidence == [
        "    table-practice at 8 ranks x 2 on resnet20 (CIFAR-10, global batch 16, 120 epochs; "
        "128 values per channel per rank at its smallest BN layer, the measured input nearest "
        "to this model's 98): SyncBN in groups of 4 ranks (syncbn4) gets back 90% of BN's loss "
        "(95% CI 80 to 100): recovers",
        "    table-recover at 4 ranks x 2 on resnet20 (CIFAR-10; 128 values per channel per rank "
        "at its smallest BN layer, as near to this model's 98 as the other): SyncBN over all 4 "
        "ranks (syncbn) gets back 84% of BN's loss (95% CI 74 to 94): unclear"]
    _, r = _json(capsys, "--model", "bnlab:resnet20", "--world", "2", "--batch-per-rank", "2",
                 *AT_8)
    assert r["recommendations"][0].startswith(
        "syncbn over all 2 ranks gives 4 samples (threshold 8): no sync group reaches it; "
        "measured: gets back 64% of BN's loss, partly, on resnet20, 4 x 2 (128 values)\n    "
        "table-recover at 4 ranks x 2 on resnet20 (CIFAR-10; 128 values")
    _, r = _json(capsys, "--model", "bnlab:resnet20", "--world", "8", "--batch-per-rank", "4",
                 *AT_8)
    assert r["recommendations"][0] == (  # 2 ranks of 4: 8 samples, the syncbn cells' count
        "syncbn with --sync-group 2 (8 samples, at least 512 values per channel a "
        "group); measured: gets back 90% of BN's loss, recovers, on resnet20, 8 x 2 (128 values)\n"
        "    table-practice at 8 ranks x 2 on resnet20 (CIFAR-10, global "
        "batch 16, 120 epochs; 128 values per channel per rank at its smallest BN layer, the "
        "measured input nearest to this model's 256): SyncBN in groups of 4 ranks (syncbn4) "
        "gets back 90% of BN's loss (95% CI 80 to 100): recovers\n    table-recover at 4 ranks "
        "x 2 on resnet20 (CIFAR-10; 128 values per channel per rank at its smallest BN layer, "
        "as near to this model's 256 as the other): SyncBN over all 4 ranks (syncbn) gets back "
        "84% of BN's loss (95% CI 74 to 94): unclear")
    _, r = _json(capsys, "--model", "bnlab:resnet20", "--world", "4", "--batch-per-rank", "3")
    assert r["recommendations"][0].endswith("a group)")  # 12 samples a group: none measured
    _, r = _json(capsys, "--model", "torchvision:mobilenet_v3_small", "--input", "3x64x64",
                 "--world", "2", "--batch-per-rank", "4", *AT_8)  # 16 values: all three as near
    head, *evidence = r["recommendations"][0].split("\n")
    assert head.endswith("; measured: gets back 90% of BN's loss, recovers, on resnet20, 8 x 2 "
                         "(128 values); as near, torchvision resnet18 at 32 px (2 values): "
                         "101%, recovers")  # another input in the sentence, in few words
    assert len(head.split()) <= 40 and len(evidence) == 3  # each input's evidence under it
    _, r = _json(capsys, "--model", "torchvision:mobilenet_v3_small", "--input", "3x64x64",
                 "--world", "2", "--batch-per-rank", "4", "--min-values", "256")
    head, *evidence = r["recommendations"][0].split("\n")  # a longer head: no room beside it
    assert head.endswith("(it gets 32); measured: gets back 90% of BN's loss, recovers, on "
                         "resnet20, 8 x 2 (128 values)") and len(head.split()) <= 40
    assert any("torchvision resnet18 at 32 px" in e for e in evidence)  # evidence only
    _, r = _json(capsys, "--model", "bnlab:resnet18", "--world", "1", "--batch-per-rank", "8")
    assert not any(t.startswith("syncbn") for t in r["recommendations"])  # 1 rank: no group
