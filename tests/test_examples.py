"""The example in examples/: a plain DDP script using bnlab's public API, under torchrun."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT


# CI time (17 s: torchrun and two ranks, each a new interpreter); make test-slow runs it. CI
# still runs real gloo DDP (test_simulate.py, test_precise_bn.py, test_bn_sync.py) and the
# API the example calls (test_normact.py, test_doctor.py, test_precise_bn.py).
@pytest.mark.slow
def test_ddp_example_trains_on_two_gloo_ranks(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           str(ROOT / "examples/ddp_own_model.py"), "--steps", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "20 BN layers at risk at 2 x 2; fixes:" in r.stdout  # the doctor's check
    assert "step 3  loss" in r.stdout
    assert "val acc after PreciseBN:" in r.stdout and "(128 images, 2 ranks)" in r.stdout
