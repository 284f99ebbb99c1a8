"""bnlab inside someone else's project: the wheel with no extra, installed into a fresh virtual
environment (offline, its dependencies from uv.lock through uv's cache), run from another
folder, carries what the doctor quotes, has a `bnlab` command, and pulls nothing of the trainer
or the lab (Hydra, omegaconf, wandb, submitit, matplotlib, torchvision)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

# CI time (about 35 s on 2 cores: a wheel build and a fresh environment); make test-slow runs it
pytestmark = pytest.mark.slow
UV = shutil.which("uv")
DOCTOR = ["doctor", "--model", "bnlab:resnet20", "--input", "3x32x32", "--world", "4",
          "--batch-per-rank", "2"]
LAB = ("hydra", "omegaconf", "wandb", "submitit", "matplotlib", "torchvision")


def _run(cmd: list[str], cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A fresh environment holding the built wheel and the locked dependencies, nothing of
    the checkout: its `bin/` folder."""
    if UV is None:
        pytest.skip("uv is not installed (make install installs it)")
    tmp = tmp_path_factory.mktemp("wheel")
    p = _run([UV, "build", "--wheel", "--offline", "-o", str(tmp / "dist")], ROOT)
    if p.returncode and "offline" in p.stderr.lower():  # uv's cache lacks the build backend
        pytest.skip("uv cannot build offline here: " + p.stderr.strip().splitlines()[-1])
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = (tmp / "dist").glob("bnlab-*.whl")
    project = tmp / "project"  # the lock alone, so uv installs bnlab's dependencies, not bnlab
    project.mkdir()
    for f in ("pyproject.toml", "uv.lock", "LICENSE"):
        shutil.copy(ROOT / f, project / f)
    venv = tmp / "venv"
    p = _run([UV, "sync", "--frozen", "--offline", "--no-install-project", "--no-dev", "-q"],
             project, {"UV_PROJECT_ENVIRONMENT": str(venv), "VIRTUAL_ENV": ""})
    assert p.returncode == 0, p.stderr[-2000:]
    p = _run([UV, "pip", "install", "--offline", "--no-deps", "-q", "--python",
              str(venv / "bin" / "python"), str(wheel)], tmp)
    assert p.returncode == 0, p.stderr[-2000:]
    return venv / "bin"


def _fixes(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("- ")]


def test_the_installed_doctor_prints_the_checkouts_fix_lines(installed, tmp_path):
    """From another folder, the installed package quotes the same measurements (package data)
    as the checkout: the same fix lines, word for word."""
    where = _run([str(installed / "python"), "-c", "import bnlab; print(bnlab.__file__)"],
                 tmp_path)
    assert "site-packages" in where.stdout, where.stdout + where.stderr  # not the checkout
    there = _run([str(installed / "bnlab"), *DOCTOR], tmp_path)
    here = _run([sys.executable, "-m", "bnlab", *DOCTOR], ROOT)
    assert there.returncode == here.returncode == 1, there.stderr[-2000:]
    assert _fixes(there.stdout) == _fixes(here.stdout) and len(_fixes(here.stdout)) >= 3
    assert "not been measured yet" not in there.stdout  # what bnlab measured travelled with it
    assert "table-recover at 4 ranks x 2 on" in there.stdout


def test_the_wheel_carries_its_license(installed, tmp_path):
    code = ("import importlib.metadata as m; d = m.distribution('bnlab'); "
            "print(d.metadata['License-Expression']); "
            "print(any(str(f).endswith('licenses/LICENSE') for f in d.files))")
    p = _run([str(installed / "python"), "-c", code], tmp_path)
    assert p.returncode == 0 and p.stdout.split() == ["MIT", "True"], p.stderr[-500:]


def test_what_needs_the_checkout_says_so_where_only_the_wheel_is(installed, tmp_path):
    """The reported tables (bnlab.claims) stay in the checkout, beside the runs they read; what
    ships and needs the checkout (bnlab runs verify re-runs its train.py) refuses in one
    sentence, exit 2, not with a traceback."""
    p = _run([str(installed / "python"), "-m", "bnlab.claims", "all", "--report"], tmp_path)
    assert p.returncode != 0 and "No module named bnlab.claims" in p.stderr
    assert p.stderr.count("\n") == 1, p.stderr[-2000:]
    run = tmp_path / "run"
    run.mkdir()
    p = _run([str(installed / "bnlab"), "runs", "verify", str(run)], tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert "works in a bnlab checkout" in p.stderr or "bnlab[lab]" in p.stderr


def test_bnlab_is_a_command_with_its_tools(installed, tmp_path):
    p = _run([str(installed / "bnlab"), "--help"], tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("usage: bnlab ")
    for command in ("doctor", "diagnose", "runs", "plot"):
        assert command in p.stdout
    p = _run([str(installed / "bnlab"), "doctor", "--world", "0", "--model",
              "bnlab:resnet20"], tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1  # bad input: one sentence, exit 2


def test_the_core_pulls_nothing_of_the_trainer_or_the_lab_and_says_which_extra(installed,
                                                                                tmp_path):
    p = _run([str(installed / "python"), "-c", "import importlib.util as u; print(' '.join("
              f"m for m in {LAB!r} if u.find_spec(m)))"], tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "", p.stdout + p.stderr
    p = _run([str(installed / "bnlab"), "runs", str(tmp_path)], tmp_path)
    assert p.returncode == 2 and "pip install 'bnlab[lab]'" in p.stderr
    assert p.stderr.count("\n") == 1
    p = _run([str(installed / "bnlab"), "doctor", "--model", "torchvision:resnet18"], tmp_path)
    assert p.returncode == 2 and "'bnlab[train]'" in p.stderr
