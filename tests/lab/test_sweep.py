"""The sweep: specs keyed by the resolved config, the job pool, stopping and resuming, and
smoke runs of the experiments' cells for a few steps: every code path they take (an all-pairs
cover of them in the default run, the rest in `make test-slow`; on SLURM:
test_sweep_slurm.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bnlab import dist, trainer
from bnlab.errors import BnlabError
from bnlab.lab.jobs import TrainJob
from bnlab.lab.local import executor, gpu_ids
from bnlab.lab.plan import Cell, plan
from bnlab.lab.spec import compose, load_spec
from bnlab.lab.sweep import sweep, train_job
from bnlab.paths import EXPERIMENTS, ROOT
from bnlab.rundir import read_status, set_status
from conftest import CIFAR_MINI, needs_cifar, run_entry, tiny_spec

SPECS = sorted(EXPERIMENTS.glob("*/sweep.yaml"))
_LOADED: dict = {}


def committed_spec(path: Path):
    """load_spec(path), once per module: composing every cell of every committed spec (well
    over a hundred) is most of this module's time, in Hydra; the parametrization below and
    the plan test read the same specs and change nothing in them."""
    if path not in _LOADED:
        _LOADED[path] = load_spec(path)
    return _LOADED[path]


def test_runs_are_keyed_by_the_resolved_config():
    jitter = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    batch = load_spec(ROOT / "experiments/batch/sweep.yaml")
    ranks = load_spec(ROOT / "experiments/ranks/sweep.yaml")
    j = {c.label: c.key for c in jitter.cells}
    b = {c.label: c.key for c in batch.cells}
    r = {c.label: c.key for c in ranks.cells}
    # The same experiment reached through different specs and names shares its runs...
    assert j["bn"] == b["bn 2"] == r["4 ranks x 2"]
    assert j["syncbn"] == b["syncbn 2"] and j["gn (32 groups)"] == b["gn 2"]
    assert r["4 ranks x 8"] == b["bn 8"]
    # ...and anything that changes the computation changes the key.
    assert len(set(j.values())) == len(j)
    assert r["4 ranks x 2 + grad_accum 4"] != b["bn 8"]
    same = compose(["experiment=jitter", "log_every=7", "name=other", "progress=false"])
    assert Cell("x", [], [0], same).key == j["bn"]
    # the warning's threshold (the doctor's, which table-values may move) logs nothing
    warned = compose(["experiment=jitter", "diagnostics.min_values=4"])
    assert Cell("x", [], [0], warned).key == j["bn"]


def test_a_cell_that_does_not_compose_fails_before_anything_runs(tmp_path):
    spec = tmp_path / "bad" / "sweep.yaml"
    spec.parent.mkdir()
    spec.write_text("experiment: jitter\ncells:\n  - {label: x, overrides: [norm=nope]}\n")
    with pytest.raises(BnlabError, match="norm=nope"):
        load_spec(spec)
    spec.write_text("experiment: jitter\ncells:\n  - {label: x, overrides: [batch_per_gpu=0]}\n")
    with pytest.raises(BnlabError, match="batch_per_gpu"):
        load_spec(spec)


def test_plan_runs_every_cell_once_seed_major_and_expensive_cells_last():
    specs = [committed_spec(p) for p in SPECS]
    steps = plan(specs, "tag")
    dirs = [d for _, _, d in steps]
    assert len(dirs) == len(set(dirs))
    expected = {(c.key, s) for sp in specs for c in sp.cells for s in c.seeds}
    assert {(d.parent.name, int(d.name[4:])) for d in dirs} == expected
    orders = [c.meta.get("order", 0) for c, _, _ in steps]
    assert orders == sorted(orders)
    first = [s for c, s, _ in steps if c.meta.get("order", 0) == 0]
    assert first == sorted(first)


@pytest.mark.slow  # CI time (40 s); make test-slow runs it
def test_sweep_runs_cells_skips_finished_ones_and_sets_unfinished_aside(tmp_path):
    spec = tiny_spec(tmp_path)
    root = tmp_path / "runs"
    # gpus=2: as on a 2-GPU machine, each of the 2 runs side by side gets a GPU of its own
    assert sweep([spec], None, jobs=2, root=root, gpus=2) == {"completed": 2}
    dirs = [d for _, _, d in plan(spec, "synthetic-64", root)]
    assert all(read_status(d) == "completed" for d in dirs)
    recs = [json.loads((d / "sweep.json").read_text()) for d in dirs]
    assert recs[0]["rc"] == 0 and sorted(r["gpus"] for r in recs) == ["0", "1"]
    assert (root / "synthetic-64" / "hosts.json").is_file()
    before = (dirs[0] / "metrics.jsonl").read_text()
    assert sweep([spec], None, jobs=2, root=root) == {}  # nothing re-run, nothing touched
    assert (dirs[0] / "metrics.jsonl").read_text() == before
    (dirs[1] / "checkpoint.pt").unlink()
    set_status(dirs[1], "running")  # as if the machine died mid-run, before any checkpoint
    set_status(dirs[0], "preempted")  # as if stopped after its last checkpoint
    assert sweep([spec], None, jobs=1, root=root) == {"completed": 2}
    kept = dirs[1].with_name("seed0.unfinished-1")
    assert kept.is_dir() and read_status(kept) == "running"
    assert read_status(dirs[1]) == "completed"
    assert "from_step" in json.loads((dirs[0] / "run.json").read_text())["resumed"][0]
    assert json.loads((dirs[0] / "sweep.json").read_text())["launches"] == 2
    assert (dirs[0] / "metrics.jsonl").read_text() == before  # resumed at the end: no new rows


@pytest.mark.slow  # CI time (71 s); resuming preempted runs is also in the test above
@pytest.mark.parametrize("ctrl_c", [False, True], ids=["sigterm", "ctrl-c"])
def test_a_stopped_sweep_checkpoints_its_runs_and_the_same_command_resumes_it(tmp_path, ctrl_c):
    """SIGTERM to the sweep (how a scheduler stops it), or Ctrl-C in its terminal (SIGINT to
    every process of the foreground group: the sweep, submitit's processes and train.py)."""
    spec = tiny_spec(tmp_path, num_train=512)
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "bnlab.lab.sweep", str(spec.path), "--jobs", "1", "--runs",
           str(root)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    first = plan(spec, "synthetic-512", root)[0][2]
    deadline = time.monotonic() + 120
    while not (first / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    if ctrl_c:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, out
    assert "run the same command to run the rest (preempted runs resume from their" in out
    assert read_status(first) == "preempted" and (first / "checkpoint.pt").is_file()
    second = plan(spec, "synthetic-512", root)[1][2]
    assert not second.exists()  # queued runs do not start once the sweep is stopping
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "will resume preempted run" in done.stdout
    assert read_status(first) == read_status(second) == "completed"
    assert json.loads((first / "sweep.json").read_text())["launches"] == 2


def test_local_runs_get_gpus_as_the_sweep_sees_them(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_ids(2) == [0, 1] and gpu_ids(0) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert gpu_ids(2) == [3, 5]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a1f,GPU-77c2")
    assert gpu_ids(2) == []  # UUIDs: the runs share the GPUs, as without the sweep


def test_k_runs_share_a_gpu_each_rank_on_a_different_one_the_least_loaded_first():
    from bnlab.lab.local import take

    free = [0, 1] * 2  # two GPUs, two runs each (--runs-per-gpu 2)
    assert take(free, 1) == [0] and take(free, 1) == [1]  # spread before packing
    assert take(free, 2) == [0, 1] and free == []  # a 2-rank run: two different GPUs
    assert take(free, 1) is None  # full: the run waits
    free = [0, 0]  # one GPU with room for two runs
    assert take(free, 2) is None and free == [0, 0]  # ranks never share a GPU; untouched
    assert take(free, 0) == [] and free == [0, 0]  # a CPU run takes none


def test_a_run_stopped_before_it_began_is_not_started(tmp_path):
    """SIGTERM can reach train.py before it installs its handler (while it imports): that run
    never began, so the job reports it not started and leaves no directory to set aside."""
    d = tmp_path / "cell" / "seed0"
    job = TrainJob([sys.executable, "-c", "import time; time.sleep(60)"], str(d), str(ROOT),
                   "a", 0, 1, 1)
    threading.Timer(2.0, job._forward, (signal.SIGTERM, None)).start()
    assert job() == {"status": "not started", "wall_s": 0.0}
    assert not d.exists()


def test_a_stop_that_comes_while_the_run_starts_reaches_it_once_it_has(tmp_path):
    """The sweep's SIGTERM can reach the job between submitit starting it and the run's
    process existing: the job passes it on as soon as the run is there, and only once."""
    d = tmp_path / "cell" / "seed0"
    job = TrainJob([sys.executable, "-c", "import time; time.sleep(60)"], str(d), str(ROOT),
                   "a", 0, 1, 1)
    job._forward(signal.SIGTERM, None)  # before any process: nothing to signal yet
    t0 = time.monotonic()
    assert job() == {"status": "not started", "wall_s": 0.0}
    assert time.monotonic() - t0 < 30 and job._signalled


def test_a_job_gives_its_run_the_sweeps_gpus_and_a_session_of_its_own(tmp_path):
    """CUDA_VISIBLE_DEVICES as the sweep chose it (submitit's controller sets its own, which
    names no GPU where the sweep's names them by UUID), and a new session, so that Ctrl-C in
    the terminal reaches the sweep and never the run's ranks directly."""
    d = tmp_path / "cell" / "seed0"
    code = ("import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'), os.getsid(0) == "
            "os.getpid())")
    job = TrainJob([sys.executable, "-c", code], str(d), str(ROOT), "a", 0, 1, 1,
                   gpus="GPU-8a1f,GPU-77c2")
    assert job()["status"] == "failed"  # no status.json: this is not train.py
    assert (d / "train.log").read_text().split() == ["GPU-8a1f,GPU-77c2", "True"]
    assert json.loads((d / "sweep.json").read_text())["gpus"] == "GPU-8a1f,GPU-77c2"


def test_in_a_slurm_job_of_several_tasks_only_the_first_writes_the_runs_records(
        tmp_path, monkeypatch):
    d = tmp_path / "cell" / "seed0"
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")  # srun sets it in each task of a step
    for rank in ("1", "0"):
        monkeypatch.setenv("SLURM_PROCID", rank)
        job = TrainJob([sys.executable, "-c", f"print('rank {rank}')"], str(d), str(ROOT),
                       "a", 0, 1, 1)
        job()
        if rank == "1":
            assert not (d / "sweep.json").exists() and not (d / "train.log").exists()
    assert (d / "train.rank1.log").read_text() == "rank 1\n"
    assert (d / "train.log").read_text() == "rank 0\n"
    assert json.loads((d / "sweep.json").read_text())["launches"] == 1


class Died:
    """A submitit job that ended without a report."""

    def task(self, k):
        return self

    def result(self):
        raise RuntimeError("killed")


def test_a_job_that_died_during_a_stop_before_its_run_began_is_not_started(tmp_path):
    from bnlab.lab.jobs import job_result

    d = tmp_path / "cell" / "seed0"
    assert job_result(Died(), d, stopping=True) == ("not started", 0.0)
    assert job_result(Died(), d, stopping=False) == ("failed", 0.0)
    d.mkdir(parents=True)
    set_status(d, "preempted")
    assert job_result(Died(), d, stopping=True) == ("preempted", 0.0)


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.slow  # CI time; the SLURM submission test below covers the requeue's parameters
def test_a_preempted_local_job_checkpoints_is_requeued_and_resumes(tmp_path):
    """submitit's preemption signal (SIGUSR2, as SLURM sends it) reaching a running job: the
    run checkpoints, the job is requeued, and the run resumes and completes in one job."""
    spec = tiny_spec(tmp_path, num_train=512)
    root = tmp_path / "runs"
    (cell, seed, d), = plan(spec, "synthetic-512", root)[:1]
    ex = executor(tmp_path / "submitit" / "%j")
    job = ex.submit(train_job(cell, seed, d, None, 1, 1, []))
    deadline = time.monotonic() + 120
    while not (d / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    (task,) = children(job._process.pid)  # the submitit job under its local controller
    os.kill(task, signal.SIGUSR2)
    assert job.result()["status"] == "completed"
    rec = json.loads((d / "sweep.json").read_text())
    assert rec["launches"] == 2 and rec["rc"] == 0
    resumed = json.loads((d / "run.json").read_text())["resumed"]
    assert len(resumed) == 1 and resumed[0]["from_step"] > 0
    assert "preempted" in (d / "train.log").read_text()


def smoke_cfg(cell: Cell) -> dict:
    cfg = json.loads(json.dumps(cell.cfg))
    micro = cfg["batch_per_gpu"] * cfg["dist"]["simulate"] * cfg["dist"]["nproc_per_node"]
    held = 16 if cfg["data"]["holdout"] else 0  # a pilot's held-out split, in small
    cfg["data"].update(root=str(CIFAR_MINI), download=False, val_limit=64,
                       train_limit=2 * micro * cfg["grad_accum"] + held, holdout=held)
    cfg.update(epochs=1, eval_every=1, max_steps=0, progress=False, checkpoint=False)
    cfg["precise_bn"]["num_samples"] = micro // cfg["batch_per_gpu"] * cfg["precise_bn"]["batch"]
    return cfg


def code_path(g: dict) -> tuple:
    """What of a cell's config chooses which code runs (not the numbers it runs with)."""
    d, pb, rec = g["data"], g["precise_bn"], g.get("record", {})
    return (g["model"]["name"], g["norm"]["kind"], g["dist"]["simulate"] > 1,
            g["dist"]["nproc_per_node"] > 1, g["grad_accum"] > 1, d.get("image_size", 32) != 32,
            d.get("holdout", 0) > 0, d["augment"], d.get("rank_skew", False), pb["every"] > 0,
            pb["at_end"], pb["mode"], pb["estimator"], pb["pooling"],
            rec.get("decompose", False), rec.get("decompose_batch", True),
            rec.get("predictions", False), g["dist"]["bn_sync"], g["dist"]["broadcast_buffers"],
            g["optim"].get("name", "sgd"), g["optim"]["schedule"], g["diagnostics"]["enabled"],
            g["norm"].get("cap_groups"), g["norm"].get("sync_group"),
            g["norm"].get("freeze_after", 0) > 0, g["norm"].get("impl"))


def _pairs(path: tuple) -> set[tuple]:
    return {(i, a, j, b) for i, a in enumerate(path) for j, b in enumerate(path) if i < j}


def all_pairs(cells: list[Cell]) -> list[Cell]:
    """Cells, picked greedily in order (few, not provably the fewest), in which every pair of
    settings that some cell combines (resnet18 with evonorm, grad_accum with the eval
    estimator, ...) is combined at least once (all-pairs testing): every model, norm and
    setting runs beside every other setting it meets in a committed cell. Combinations of
    three or more settings are left to the slow test below (45 of the 79 code paths run
    here when this was written)."""
    pairs = [_pairs(code_path(c.cfg)) for c in cells]  # each cell's, computed once
    todo, out = set().union(*pairs), []
    while todo:
        best = max(range(len(cells)), key=lambda i: len(pairs[i] & todo))
        out.append(cells[best])
        todo -= pairs[best]
    return out


def unique_cells(real: bool) -> list[Cell]:
    """One cell for each code path: cells that differ only in numbers the code does not
    branch on (a rate, a group count, a freeze epoch, how many images are held out) take the
    same path, and the first of them stands for it."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:])
    for p in SPECS[::-1] if worker % 2 else SPECS:  # two workers compose from both ends,
        committed_spec(p)  # each reading what the other composed (conftest's compose)
    seen, out = set(), []
    for p in SPECS:
        for c in committed_spec(p).cells:
            shape = code_path(c.cfg)
            if shape not in seen and (c.cfg["dist"]["nproc_per_node"] > 1) == real:
                seen.add(shape)
                out.append(c)
    return out


PATHS = unique_cells(real=False)
COVER = all_pairs(PATHS)


@needs_cifar
@pytest.mark.parametrize("cell", [
    *COVER, *(pytest.param(c, marks=pytest.mark.slow) for c in PATHS if c not in COVER)],
    ids=lambda c: c.key)
def test_every_code_path_of_the_experiment_cells_trains_a_few_steps(cell, tmp_path):
    """The all-pairs cover in every run; the other code paths in `make test-slow`."""
    cfg = smoke_cfg(cell)
    env = dist.init("cpu", "auto", 60, 1)
    res = trainer.run(cfg, tmp_path, env)
    assert read_status(tmp_path) == "completed"
    assert math.isfinite(res["val/acc"])
    if cfg["precise_bn"]["every"]:
        assert "val/acc_precise" in res


@needs_cifar
@pytest.mark.slow  # 4 real gloo processes per cell; the 4-process path is tested in test_train
def test_real_ddp_experiment_cells_run_a_few_steps(tmp_path):
    for cell in unique_cells(real=True):
        cfg = smoke_cfg(cell)
        args = [*cell.overrides, f"data.root={CIFAR_MINI}", "data.download=false",
                f"data.train_limit={cfg['data']['train_limit']}", "data.val_limit=64",
                "epochs=1", "eval_every=1", "max_steps=0", "progress=false",
                "checkpoint=false", f"hydra.run.dir={tmp_path / cell.key}"]
        p = run_entry("train.py", *args, cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-2000:]
        assert read_status(tmp_path / cell.key) == "completed"
        assert json.loads((tmp_path / cell.key / "run.json").read_text())["processes"] == 4


def test_a_sweep_refuses_a_dirty_working_tree_unless_allowed(tmp_path, monkeypatch, capsys):
    """Runs a table reports come from committed code only; --allow-dirty is for trials."""
    import bnlab.lab.sweep as sweep_module

    spec = tiny_spec(tmp_path)
    monkeypatch.delenv("BNLAB_ALLOW_DIRTY")
    monkeypatch.setattr(sweep_module, "git_commit", lambda: "abc123-dirty")
    with pytest.raises(BnlabError, match="uncommitted changes.*--allow-dirty"):
        sweep([spec], None, jobs=1, root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()  # refused before anything was written
    from bnlab.lab.sweep import main
    assert main([str(spec.path), "--runs", str(tmp_path / "runs"), "--jobs", "1"]) == 2
    assert "uncommitted changes" in capsys.readouterr().err
    monkeypatch.setattr(sweep_module, "git_commit", lambda: "abc123")
    assert sweep_module.launcher_kwargs(sweep_module.argparse.Namespace(
        launcher="local", allow_dirty=True, stop_after=None, drain_after=None, runs_per_gpu=None,
        **dict.fromkeys(sweep_module.SLURM_ONLY))) == \
        {"launcher": "local", "allow_dirty": True}
    assert sweep_module.launcher_kwargs(sweep_module.argparse.Namespace(
        launcher="local", allow_dirty=False, stop_after=90.0, drain_after=60.0, runs_per_gpu=None,
        **dict.fromkeys(sweep_module.SLURM_ONLY))) == \
        {"launcher": "local", "stop_after": 90.0, "drain_after": 60.0}


def test_the_progress_bar_counts_epochs_from_the_runs_logs(tmp_path):
    """A sweep's bar moves with each running run's last logged epoch, not only at run ends."""
    from bnlab.lab.local import epoch_reached

    assert epoch_reached(tmp_path) == 0.0  # not started: no metrics.jsonl yet
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "epoch": 0.25}\n' + '{"step": 5, "epoch": 1.5, "train/loss": 2.0}\n'
        + '{"step": 6, "epo')  # the line being written
    assert epoch_reached(tmp_path) == 1.5


@pytest.mark.slow  # CI time (three launches, 40-90 s); make test-slow runs it
def test_a_sweep_stopped_by_its_time_limit_resumes_to_completion(tmp_path, monkeypatch):
    """--stop-after: at the limit the sweep stops as SIGTERM does (the running run checkpoints
    and stops as preempted, the queued one does not start); the same sweep without a limit
    then resumes it and runs the other to the end. The limit passes on a clock that jumps an
    hour once the first run has begun training, so the test does not depend on its speed."""
    from types import SimpleNamespace

    from bnlab.lab import local

    spec = tiny_spec(tmp_path, num_train=512)
    root = tmp_path / "runs"
    first, second = (d for *_, d in plan(spec, "synthetic-512", root))
    real = time.monotonic
    monkeypatch.setattr(local, "time", SimpleNamespace(sleep=time.sleep, monotonic=lambda: real(
        ) + (3600.0 if (first / "metrics.jsonl").is_file() else 0.0)))
    counts = sweep([spec], None, 1, root=root, allow_dirty=True, stop_after=1.0)
    assert counts == {"preempted": 1, "not started": 1}, counts
    assert read_status(first) == "preempted" and (first / "checkpoint.pt").is_file()
    assert not second.exists()
    monkeypatch.undo()
    assert sweep([spec], None, 1, root=root, allow_dirty=True) == {"completed": 2}
    assert read_status(first) == read_status(second) == "completed"
    assert json.loads((first / "sweep.json").read_text())["launches"] == 2
    assert "from_step" in json.loads((first / "run.json").read_text())["resumed"][0]


def test_a_draining_sweep_lets_its_running_runs_finish_and_starts_no_more(tmp_path,
                                                                          monkeypatch):
    """--drain-after: past the limit no run starts, but the running one is not asked to stop
    (no SIGTERM reaches it) and ends as it would have; the rest count as not started. The
    runs are stand-ins that end when told, on a clock that jumps an hour at the first start."""
    from types import SimpleNamespace

    from bnlab.lab import local

    spec = tiny_spec(tmp_path)
    todo = plan(spec, "synthetic-64", tmp_path / "runs")
    started = []

    class Job:  # a run that ends at its second poll, and records any signal sent to it
        def __init__(self, run):
            self.run, self.signals, self.polls = run, [], 0
            self._process = SimpleNamespace(poll=lambda: None, send_signal=self.signals.append)

        def done(self):
            self.polls += 1
            return self.polls > 1

    monkeypatch.setattr(local, "executor", lambda folder: SimpleNamespace(
        update_parameters=lambda **kw: None,
        submit=lambda run: started.append(Job(run)) or started[-1]))
    monkeypatch.setattr(local, "job_result", lambda job, d, stopping: ("completed", 1.0))
    real = time.monotonic
    monkeypatch.setattr(local, "time", SimpleNamespace(sleep=lambda s: None, monotonic=lambda: (
        real() + (3600.0 if started else 0.0))))
    runs = [SimpleNamespace(gpus=None) for _ in todo]
    counts = local.run_local(todo, runs, tmp_path / "submitit", 1, 0, "tiny", drain_after=1.0)
    assert counts == {"completed": 1, "not started": 1}, counts
    assert len(started) == 1 and started[0].run is runs[0]
    assert started[0].polls == 2 and started[0].signals == []  # it ran on past the limit
    assert local.run_local(todo[1:], runs[1:], tmp_path / "submitit", 1, 0, "tiny",
                           drain_after=1.0) == {"completed": 1}  # the same command: the rest
    from bnlab.lab.sweep import outcome  # runs left: the sweep says so, exit 75

    assert outcome(counts, 1.0) == 75 and outcome({"completed": 1}, 1.0) == 0


@pytest.mark.parametrize("args, said", [
    (["--stop-after", "0"], "--stop-after=0 must be a positive number of minutes"),
    (["--stop-after", "5", "--launcher", "slurm"], "--stop-after is for sweeps on this machine"),
    (["--drain-after", "-1"], "--drain-after=-1 must be a positive number of minutes"),
    (["--drain-after", "5", "--launcher", "slurm"], "--drain-after is for sweeps on this machine"),
    (["--runs-per-gpu", "0"], "--runs-per-gpu=0 must be at least 1"),
    (["--runs-per-gpu", "4", "--launcher", "slurm"], "--runs-per-gpu is for sweeps on this"),
])
def test_a_bad_time_limit_or_packing_is_one_sentence(args, said, capsys):
    from bnlab.lab.sweep import main

    assert main([str(EXPERIMENTS / "jitter/sweep.yaml"), *args, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_packing_runs_on_gpus_needs_gpus_it_can_hand_out(tmp_path, monkeypatch, capsys):
    """--runs-per-gpu on a machine without GPUs (or with GPUs named by UUID) would pack
    nothing: one sentence, before any run starts."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    spec = tiny_spec(tmp_path)
    with pytest.raises(BnlabError, match="--runs-per-gpu=2 needs GPUs this sweep can hand out"):
        sweep([spec], None, 2, root=tmp_path / "runs", allow_dirty=True, gpus=0,
              runs_per_gpu=2)
    assert not list((tmp_path / "runs").rglob("config.yaml"))  # nothing ran


def test_the_bar_never_shows_fewer_epochs_than_its_resumed_runs_started_with():
    """A resuming run's log steps back to its checkpoint: the bar holds, its time left stays
    positive."""
    from tqdm import tqdm

    from bnlab.lab.local import advance

    with tqdm(total=100, disable=True) as bar:
        bar.initial = 30.7
        advance(bar, 30.6)
        assert bar.n == 30.7
        advance(bar, 31.5)
        assert bar.n == 31.5


def test_a_real_ddp_cells_processes_share_the_runs_threads():
    from bnlab.lab.plan import Cell
    from bnlab.lab.sweep import per_process

    def cell(nproc: int) -> Cell:
        return Cell("c", [], [0], cfg={"dist": {"nproc_per_node": nproc}})

    assert per_process(2, cell(1)) == 2 and per_process(2, cell(4)) == 1
    assert per_process(8, cell(4)) == 2 and per_process(1, cell(4)) == 1
