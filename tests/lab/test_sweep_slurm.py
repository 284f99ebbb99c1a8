"""The sweep on SLURM against stand-ins for srun, sbatch, sacct, squeue and scancel: one job
array with the asked resources, a later command that follows what is still there, the wait,
and the stop (the real cluster's tests are in test_slurm.py)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest

from bnlab.errors import BnlabError
from bnlab.lab.jobs import TrainJob
from bnlab.lab.plan import plan
from bnlab.lab.slurm import Slurm
from bnlab.lab.spec import load_spec
from bnlab.lab.sweep import sweep
from bnlab.paths import EXPERIMENTS
from bnlab.rundir import set_status
from conftest import tiny_spec

FAKE_SBATCH = """#!/bin/bash
cp "$1" "{out}/sbatch-$(ls {out} | wc -l).sh"
echo "Submitted batch job 4242"
"""


def fake_slurm(tmp_path: Path, monkeypatch, sacct_state: str | None = "RUNNING",
               squeue: str = "") -> Path:
    """srun, sbatch, sacct and squeue stand-ins on PATH: sbatch keeps each script it is
    given; sacct knows both jobs of the array in `sacct_state` (None: nothing, as without
    accounting) and squeue prints `squeue`."""
    bin_, out = tmp_path / "bin", tmp_path / "sbatch"
    bin_.mkdir()
    out.mkdir()
    known = f"echo '4242_[0-1]|{sacct_state}|node1'\n" if sacct_state else ""
    scripts = {"srun": "#!/bin/bash\nexit 0\n", "sbatch": FAKE_SBATCH.format(out=out),
               "scancel": f"#!/bin/bash\necho \"$*\" >> {tmp_path}/scancel.log\n",
               "sacct": f"#!/bin/bash\necho 'JobID|State|NodeList'\n{known}",
               "squeue": f"#!/bin/bash\nprintf '{squeue}'\n"}
    for name, text in scripts.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    return out


def test_slurm_submits_one_array_with_the_asked_resources(tmp_path, monkeypatch):
    out = fake_slurm(tmp_path, monkeypatch)
    spec = tiny_spec(tmp_path)
    root = tmp_path / "runs"
    slurm = Slurm(partition="gpu", gpus_per_node=1, time_min=90, signal_delay_s=100,
                  setup=["source .venv/bin/activate"])
    counts = sweep([spec], None, jobs=2, root=root, launcher="slurm", slurm=slurm, wait=False)
    assert counts == {"submitted": 2}
    (script,) = [f.read_text() for f in out.iterdir()]
    for line in ("#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1", "#SBATCH --time=90",
                 "#SBATCH --signal=USR2@100", "#SBATCH --array=0-1%2", "#SBATCH --nodes=1",
                 "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=1",
                 "#SBATCH --job-name=bnlab", "source .venv/bin/activate"):
        assert line in script.splitlines(), line
    (run,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert "-m submitit.core._submit" in run and "--cpus-per-task 1" in run
    for i, (_, seed, d) in enumerate(plan(spec, "synthetic-64", root)):
        rec = json.loads((d / "job.json").read_text())
        assert rec["job_id"] == f"4242_{i}"
        pickled = Path(rec["folder"]) / f"4242_{i}_submitted.pkl"
        job = pickle.loads(pickled.read_bytes()).function
        assert isinstance(job, TrainJob) and job.run_dir == str(d)
        assert f"hydra.run.dir={d}" in job.cmd and f"seed={seed}" in job.cmd
        assert "dist.threads=1" in job.cmd and "resume=auto" in job.cmd
    # The same command again: both are still queued or running there, so nothing is resubmitted.
    assert sweep([spec], None, jobs=2, root=root, launcher="slurm", slurm=slurm,
                 wait=False) == {"on SLURM": 2}
    assert len(list(out.iterdir())) == 1


def test_a_second_command_follows_runs_still_on_slurm_to_their_end(tmp_path, monkeypatch):
    """Submitted by a first command (--no-wait), still running: the second submits nothing,
    waits for them, and reports how they ended (the tables are written only then)."""
    from submitit.core.utils import cloudpickle_dump

    import bnlab.lab.slurm as slurm_module

    out = fake_slurm(tmp_path, monkeypatch)
    monkeypatch.setattr(slurm_module, "SLURM_POLL_S", 0.1)
    spec, root = tiny_spec(tmp_path), tmp_path / "runs"
    assert sweep([spec], None, jobs=2, root=root, launcher="slurm", wait=False) == \
        {"submitted": 2}
    dirs = [d for _, _, d in plan(spec, "synthetic-64", root)]

    def finish():  # what the jobs' first tasks leave when their runs complete
        for d in dirs:
            set_status(d, "completed")
            rec = json.loads((d / "job.json").read_text())
            cloudpickle_dump(("success", {"status": "completed", "wall_s": 5.0}),
                             Path(rec["folder"]) / f"{rec['job_id']}_0_result.pkl")

    threading.Timer(1.0, finish).start()
    assert sweep([spec], None, jobs=2, root=root, launcher="slurm") == {"completed": 2}
    assert len(list(out.iterdir())) == 1  # one sbatch: nothing was submitted twice


@pytest.mark.parametrize(("queue", "resubmitted"), [("4242_0 RUNNING\\n", 1), ("", 2)])
def test_a_job_sacct_does_not_know_is_asked_of_squeue(tmp_path, monkeypatch, queue,
                                                      resubmitted):
    """Without accounting (sacct knows no job) a run's last job counts as still there only
    if squeue lists it; one gone from both is submitted again."""
    out = fake_slurm(tmp_path, monkeypatch, sacct_state=None, squeue=queue)
    spec, root = tiny_spec(tmp_path), tmp_path / "runs"
    sweep([spec], None, jobs=2, root=root, launcher="slurm", wait=False)
    counts = sweep([spec], None, jobs=2, root=root, launcher="slurm", wait=False)
    assert counts.get("submitted") == resubmitted
    assert counts.get("on SLURM", 0) == 2 - resubmitted
    assert len(list(out.iterdir())) == 2


def test_a_job_slurm_dropped_without_a_report_ends_the_wait(tmp_path, monkeypatch):
    """Killed before its first task could report, on a cluster without accounting: neither
    sacct nor squeue knows it any more, so the sweep stops waiting and reads the run."""
    import bnlab.lab.slurm as slurm_module

    fake_slurm(tmp_path, monkeypatch, sacct_state=None, squeue="")
    monkeypatch.setattr(slurm_module, "SLURM_POLL_S", 0.1)
    spec = tiny_spec(tmp_path)
    t0 = time.monotonic()
    assert sweep([spec], None, jobs=2, root=tmp_path / "runs", launcher="slurm") == \
        {"failed": 2}
    assert time.monotonic() - t0 < 60


def test_a_stopped_slurm_sweep_cancels_queued_jobs_then_asks_running_ones_to_checkpoint(
        tmp_path, monkeypatch):
    """Queued first, so none starts in between; running ones get SIGTERM (their runs
    checkpoint) rather than being killed."""
    import bnlab.lab.slurm as slurm_module

    fake_slurm(tmp_path, monkeypatch)
    monkeypatch.setattr(slurm_module, "SLURM_POLL_S", 0.1)
    spec = tiny_spec(tmp_path)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    counts = sweep([spec], None, jobs=2, root=tmp_path / "runs", launcher="slurm",
                   slurm=Slurm(), wait=True)
    assert counts == {"preempted": 2}
    assert (tmp_path / "scancel.log").read_text().splitlines() == [
        "--state=PENDING 4242_0 4242_1", "--signal=TERM --state=RUNNING 4242_0 4242_1"]


def test_slurm_gives_a_real_ddp_cell_one_task_per_rank(tmp_path, monkeypatch):
    out = fake_slurm(tmp_path, monkeypatch)
    spec = tmp_path / "ddp" / "sweep.yaml"
    spec.parent.mkdir()
    spec.write_text("experiment: demo\nseeds: [0]\ncells:\n  - {label: a, overrides: "
                    "[data=synthetic, data.num_train=64, dist.simulate=1, "
                    "dist.nproc_per_node=2]}\n")
    sweep([load_spec(spec)], None, jobs=1, root=tmp_path / "runs", launcher="slurm",
          slurm=Slurm(nodes=2), wait=False)
    (script,) = [f.read_text().splitlines() for f in out.iterdir()]
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script


@pytest.mark.parametrize("opt", ["--partition=gpu", "--gpus-per-node=1", "--time=60",
                                 "--signal-delay=30", "--setup=true", "--no-wait", "--nodes=1"])
def test_slurm_options_without_the_slurm_launcher_are_refused(opt, capsys):
    from bnlab.lab.sweep import main

    assert main([str(EXPERIMENTS / "jitter/sweep.yaml"), opt, "--dry-run"]) == 2
    flag = opt.split("=")[0]
    assert f"{flag} is a SLURM option" in capsys.readouterr().err


def test_slurm_lays_out_one_task_per_rank_and_refuses_a_layout_that_does_not_fit():
    two_nodes = Slurm(nodes=2, gpus_per_node=8)
    assert two_nodes.layout(1) == (1, 1)  # one rank (or a simulation): one task, one node
    assert two_nodes.layout(4) == (2, 2)
    p = two_nodes.parameters(4, 1, 2)
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"]) == (2, 2, 2)
    assert two_nodes.parameters(1, 1, 2)["gpus_per_node"] == 1
    with pytest.raises(BnlabError, match="cannot be laid out as --nodes 2 x --tasks-per-node 1"):
        Slurm(nodes=2).layout(3)
    with pytest.raises(BnlabError, match="product is 4"):
        Slurm(tasks_per_node=3).layout(4)
    with pytest.raises(BnlabError, match="--gpus-per-node 1 is fewer than the 4 ranks"):
        Slurm(gpus_per_node=1).layout(4)
