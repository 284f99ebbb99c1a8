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

GOLDEN = ROOT / "tests" / "golden" / "resnet20-bn-4x2"


@needs_cifar
def test_the_golden_run_re_runs_bit_for_bit_at_the_current_code():
    """A change that alters the floats fails here. The golden run is updated only by a
    deliberate commit that says why (tests/golden/README.md)."""
    cap = floatenv.capability_of(json.loads((GOLDEN / "run.json").read_text()))
    if not floatenv.can_emulate(cap):
        pytest.skip(f"the golden run computed on {cap} kernels, which this CPU "
                    f"({floatenv.record()['cpu_capability']}) can neither run nor emulate")
    v = verify.verify(GOLDEN, steps=64, as_recorded=True, data=str(CIFAR_MINI))
    assert v["identical"], verify.said(GOLDEN, v)
    assert v["compared"] >= 20 and v["config"] == []  # losses, accuracies, rates, evaluations


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
