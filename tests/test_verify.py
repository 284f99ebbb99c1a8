"""`bnlab runs verify`: a committed run re-run at the current code, compared to the bit; the
golden run (tests/golden/) a change that alters the floats fails on; bad run directories."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from bnlab import floatenv
from bnlab.__main__ import main
from bnlab.errors import BnlabError
from bnlab.lab import identity, verify
from conftest import CIFAR_MINI, ROOT, needs_cifar

# One golden run per CPU it was made on (<vendor>-<capability>): the same run, the same commit
GOLDENS = sorted((ROOT / "tests" / "golden" / "resnet20-bn-4x2").glob("*/run.json"))
GOLDEN = GOLDENS[0].parent


def _floats(run_json) -> dict:
    return json.loads(run_json.read_text()).get("floats") or {}


def test_the_golden_runs_are_one_config_at_one_commit_on_different_cpus():
    infos = [json.loads(p.read_text()) for p in GOLDENS]
    assert len(infos) >= 2 and len({(i["commit"], tuple(i["overrides"])) for i in infos}) == 1
    assert [p.parent.name for p in GOLDENS] == [
        f"{floatenv.vendor_of(i['floats'])}-{i['floats']['cpu_capability']}" for i in infos]
    # why there is one a CPU: each logs other floats from the first logged step on
    assert len({(p.parent / "metrics.jsonl").read_text().splitlines()[0] for p in GOLDENS}) == \
        len(GOLDENS)


@needs_cifar
def test_the_golden_run_re_runs_bit_for_bit_at_the_current_code():
    """A change that alters the floats fails here, on every CPU a golden run was made on. The
    golden runs are updated only by a deliberate commit that says why (tests/golden/README.md)."""
    mine = [p.parent for p in GOLDENS if floatenv.can_reproduce(_floats(p))]
    if not mine:
        here = floatenv.record()
        pytest.skip(f"no golden run was made on a CPU whose kernels this one reproduces "
                    f"({floatenv.vendor_of(here)}, {here['cpu_capability']}); add one as "
                    "tests/golden/README.md says")
    for run in mine:
        v = verify.verify(run, steps=64, as_recorded=True, data=str(CIFAR_MINI))
        assert v["identical"], verify.said(run, v)
        assert v["compared"] >= 20 and v["config"] == []  # losses, accuracies, rates, evals


def test_the_first_difference_is_found_at_one_ulp_and_train_loss_comes_first():
    want = {(8, "train/acc"): 12.5, (8, "train/loss"): 2.4, (16, "train/loss"): 2.3,
            (16, "val/acc"): 10.0}
    got = dict(want)
    assert identity.first_difference(want, got)[1] is None
    got[16, "train/loss"] = math.nextafter(2.3, 3.0)  # one ulp
    got[16, "val/acc"] = 11.0
    same, first = identity.first_difference(want, got)
    assert first == (16, "train/loss", 2.3, math.nextafter(2.3, 3.0)) and len(same) == 4


def test_verify_refuses_what_is_no_complete_run_in_one_sentence(tmp_path, capsys):
    assert main(["runs", "verify", str(tmp_path / "nowhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    run = tmp_path / "run"
    shutil.copytree(GOLDEN, run)
    (run / "config.yaml").unlink()
    assert main(["runs", "verify", str(run)]) == 2
    err = capsys.readouterr().err
    assert "holds no config.yaml: not a bnlab run directory" in err and err.count("\n") == 1
    with pytest.raises(BnlabError, match="logged no train/loss at or before step 4"):
        verify.verify(GOLDEN, steps=4)  # it logs every 8 steps


def test_a_capability_this_cpu_cannot_run_is_refused_not_approximated():
    wider = {"AVX2": "AVX512", "DEFAULT": "AVX2"}.get(floatenv.record()["cpu_capability"])
    if wider is None:
        pytest.skip("this CPU runs the widest capability bnlab knows")
    with pytest.raises(BnlabError, match="cannot be emulated here"):
        verify.kernel_env({"floats": {"cpu_capability": wider}}, True, None)
    env, words = verify.kernel_env({}, False, "DEFAULT")
    assert env["ATEN_CPU_CAPABILITY"] == "default" and "emulated" in words
