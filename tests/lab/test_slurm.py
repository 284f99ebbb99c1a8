"""Sweeps on a real SLURM cluster (`make test-slurm`; the `slurm` marker, left out of `make
test`): skipped where `sinfo` and `sacct` cannot reach one. `tests/slurm/local-cluster.sh`
starts a one-node cluster on a Debian machine (`--two-nodes`: two, for the test that needs
two nodes, which is skipped where fewer are idle).

The runs go under `outputs/test-slurm/` in the repository (every node must see them; set
BNLAB_SLURM_TEST_DIR for another shared folder) and train on generated data on the CPU;
BNLAB_SLURM_PARTITION names a partition (default: the cluster's)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bnlab.lab.plan import plan
from bnlab.lab.slurm import Slurm
from bnlab.lab.spec import load_spec
from bnlab.lab.sweep import sweep
from bnlab.paths import ROOT
from bnlab.rundir import read_status
from conftest import run_dirs


def slurm_reachable() -> bool:
    try:
        return all(subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
                   for cmd in (["sinfo", "-h"], ["sacct", "-n", "-X", "-S", "now"]))
    except (OSError, subprocess.SubprocessError):
        return False


pytestmark = pytest.mark.slurm


@pytest.fixture(autouse=True, scope="module")
def cluster():
    """Asked once, and only when these tests run (not where `-m 'not slurm'` leaves them out)."""
    if not slurm_reachable():
        pytest.skip("no SLURM cluster answers sinfo and sacct here "
                    "(tests/slurm/local-cluster.sh starts one)")

CELL = ("model=resnet20, data=synthetic, data.num_train={n}, data.train_limit=0, "
        "data.num_val=64, data.val_limit=0, epochs=1, batch_per_gpu=4, eval_every=1, "
        "log_every=25, diagnostics.enabled=false")
SIM2 = "dist.simulate=2"
DDP2 = "dist.simulate=1, dist.nproc_per_node=2, norm=syncbn"


@pytest.fixture
def where():
    """A fresh folder every node sees (the runs and the spec), removed afterwards."""
    base = Path(os.environ.get("BNLAB_SLURM_TEST_DIR", ROOT / "outputs" / "test-slurm"))
    d = base / uuid.uuid4().hex[:8]
    d.mkdir(parents=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def spec_file(where: Path, cells: dict[str, str], n: int) -> Path:
    f = where / "spec" / "sweep.yaml"
    f.parent.mkdir()
    lines = [f"  - {{label: {label}, overrides: [{CELL.format(n=n)}, {extra}]}}"
             for label, extra in cells.items()]
    f.write_text("experiment: demo\nseeds: [0]\ncells:\n" + "\n".join(lines) + "\n")
    return f


def slurm(**kw) -> Slurm:
    return Slurm(partition=os.environ.get("BNLAB_SLURM_PARTITION"), **kw)


def record(d: Path, name: str) -> dict:
    return json.loads((d / name).read_text())


def test_a_simulated_and_a_two_task_ddp_run_complete_and_a_second_command_submits_nothing(
        where):
    spec = load_spec(spec_file(where, {"sim2": SIM2, "ddp2": DDP2}, 256), here=False)
    runs = where / "runs"
    assert sweep([spec], None, jobs=2, root=runs, launcher="slurm", slurm=slurm()) == \
        {"completed": 2}
    sim, ddp = [d for _, _, d in plan(spec, "synthetic-256", runs)]
    assert record(sim, "run.json")["simulated"] is True
    meta = record(ddp, "run.json")
    assert (meta["launcher"], meta["world"], meta["syncbn_impl"]) == ("slurm", 2, "bnlab")
    assert (ddp / "train.rank1.log").is_file()  # task 1 logs beside task 0's train.log
    for d in (sim, ddp):
        rec = record(d, "sweep.json")
        assert (rec["rc"], rec["launches"]) == (0, 1)
        assert record(d, "job.json")["job_id"]
    assert sweep([spec], None, jobs=2, root=runs, launcher="slurm", slurm=slurm()) == {}


def test_a_job_warned_of_its_time_limit_checkpoints_is_requeued_and_resumes(where):
    """A 2-minute limit with the warning 60 s ahead (SLURM sends SIGUSR2 between about 60 and
    90 s before the end): a 2-rank run of 750 steps (about 75 s of training at the 10 steps/s
    of one CPU core per rank) cannot finish in the first launch; its job is requeued (as often
    as it takes: submitit allows 3 timeouts) and resumes it."""
    spec = load_spec(spec_file(where, {"ddp2": DDP2}, 6000), here=False)
    runs = where / "runs"
    counts = sweep([spec], None, jobs=1, root=runs, launcher="slurm",
                   slurm=slurm(time_min=2, signal_delay_s=60))
    assert counts == {"completed": 1}
    (d,) = [d for _, _, d in plan(spec, "synthetic-6000", runs)]
    rec = record(d, "sweep.json")
    assert rec["launches"] >= 2 and rec["rc"] == 0
    resumed = record(d, "run.json")["resumed"]
    assert len(resumed) == rec["launches"] - 1 and resumed[0]["from_step"] > 0
    assert "preempted" in (d / "train.log").read_text()


def test_a_stopped_sweep_checkpoints_its_running_job_and_the_same_command_resumes_it(where):
    spec = spec_file(where, {"ddp2": DDP2}, 4000)
    runs = where / "runs"
    cmd = [sys.executable, "-m", "bnlab.lab.sweep", str(spec), "--runs", str(runs), "--jobs",
           "1", "--launcher", "slurm"]
    if os.environ.get("BNLAB_SLURM_PARTITION"):
        cmd += ["--partition", os.environ["BNLAB_SLURM_PARTITION"]]
    (d,) = [d for _, _, d in plan(load_spec(spec, here=False), "synthetic-4000", runs)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 300
    while not ((d / "metrics.jsonl").is_file() and
               '"step": 50' in (d / "metrics.jsonl").read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the run never trained"
        time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, out
    deadline = time.monotonic() + 120  # scancel --signal=TERM: the run checkpoints and stops
    while read_status(d) == "running":
        assert time.monotonic() < deadline, "the run did not stop"
        time.sleep(1)
    assert read_status(d) == "preempted"
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_status(d) == "completed"
    assert record(d, "run.json")["resumed"][0]["from_step"] > 0
    assert record(d, "sweep.json")["launches"] == 2


def test_a_run_over_two_nodes_has_one_directory_wherever_srun_starts_it(where):
    """One rank per node: as a sweep's job (srun in the job's batch script, on the first
    node) and as `srun -N2 -n2 python train.py` from this machine, which runs no rank (rank 0
    is found on the step's first node, not where srun ran)."""
    idle = subprocess.run(["sinfo", "-h", "-t", "idle", "-o", "%D"], capture_output=True,
                          text=True).stdout.split()
    if sum(int(n) for n in idle) < 2:
        pytest.skip("fewer than 2 idle SLURM nodes (tests/slurm/local-cluster.sh --two-nodes)")
    spec = load_spec(spec_file(where, {"ddp2": DDP2}, 256), here=False)
    runs = where / "runs"
    assert sweep([spec], None, jobs=1, root=runs, launcher="slurm", slurm=slurm(nodes=2)) == \
        {"completed": 1}
    (d,) = [d for _, _, d in plan(spec, "synthetic-256", runs)]
    job = record(d, "job.json")["job_id"]
    nodes = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "NNodes", "-j", job],
                           capture_output=True, text=True).stdout.split()
    assert nodes == ["2"]
    assert (record(d, "run.json")["launcher"], record(d, "run.json")["world"]) == ("slurm", 2)

    out = where / "srun"
    part = os.environ.get("BNLAB_SLURM_PARTITION")
    cmd = ["srun", "-N2", "-n2", *(["-p", part] if part else []), sys.executable,
           str(ROOT / "train.py"), *[o.strip() for o in f"{CELL.format(n=256)}, {DDP2}"
                                     .split(",")],
           "experiment=demo", f"output_dir={out}", "progress=false", "dist.timeout_s=120"]
    r = subprocess.run(cmd, cwd=where, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (run,) = run_dirs(out)  # every task, on either node, wrote into one directory
    assert run.name.startswith("slurm-") and run.name.endswith(".0")
    assert read_status(run) == "completed"
    assert (record(run, "run.json")["launcher"], record(run, "run.json")["world"]) == \
        ("slurm", 2)
