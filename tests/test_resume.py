"""Runs that survive: resume after kill -9, preemption, a dead rank, NaN, and the run
directory's rules for resuming."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from bnlab import resume
from bnlab.errors import BnlabError
from bnlab.rundir import read_status, read_status_full, set_status
from conftest import ROOT, run_entry, run_here

TINY = ["model=resnet20", "data=synthetic", "data.num_train=256", "data.num_val=64", "epochs=2",
        "batch_per_gpu=8", "eval_every=2", "log_every=2", "progress=false", "dist.threads=1"]
SIM = [*TINY, "dist.simulate=2", "checkpoint_every=4", "record.predictions=true",
       "record.decompose=true", "record.decompose_samples=128"]
TIMING = ("images_per_s",)


def metrics(d: Path) -> list[dict]:
    """metrics.jsonl without wall-clock timings, which no two runs share."""
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k not in TIMING}
            for r in rows]


def assert_same_run(a: Path, b: Path, predictions: bool = True) -> None:
    ca = torch.load(a / "checkpoint.pt", weights_only=True)
    cb = torch.load(b / "checkpoint.pt", weights_only=True)
    full_a, full_b = ca["resume"]["model"], cb["resume"]["model"]
    assert full_a.keys() == full_b.keys()
    for k in full_a:
        assert torch.equal(full_a[k], full_b[k]), k  # bitwise, every rank's buffers included
    for sa, sb in zip(ca["optimizer"]["state"].values(), cb["optimizer"]["state"].values(),
                      strict=True):
        assert torch.equal(sa["momentum_buffer"], sb["momentum_buffer"])
    assert metrics(a) == metrics(b)  # no line lost or repeated
    if not predictions:  # a run without record.predictions
        assert not (a / "predictions.jsonl").exists() and not (b / "predictions.jsonl").exists()
        return
    preds = (a / "predictions.jsonl").read_text()
    assert preds.count('"kind": "batch"') == 4  # 2 epochs x 2 evaluations, decomposed
    assert preds == (b / "predictions.jsonl").read_text()


def start(args: list[str], run_dir: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args,
                             f"hydra.run.dir={run_dir}"], cwd=run_dir.parent,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        f = run_dir / "metrics.jsonl"
        if f.is_file() and any(json.loads(ln).get("step", 0) >= step
                               for ln in f.read_text().splitlines() if ln.endswith("}")):
            return
        assert proc.poll() is None, "the run ended before it was interrupted"
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {timeout} s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run that every interrupted one must reproduce."""
    d = tmp_path_factory.mktemp("ref") / "run"
    p = run_here("train.py", *SIM, f"hydra.run.dir={d}", cwd=d.parent)
    assert p.returncode == 0, p.stderr[-2000:]
    return d


def test_kill_9_mid_epoch_then_resume_reproduces_the_run_bitwise(reference, tmp_path):
    d = tmp_path / "run"
    proc = start(SIM, d, tmp_path / "first.log")
    wait_for_step(d, 10, proc)  # mid-epoch 1 (16 steps per epoch), after the step-8 checkpoint
    proc.kill()
    proc.wait()
    assert read_status(d) == "running"
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "train/lo')  # a line torn by the crash
    p = run_here("train.py", *SIM, f"hydra.run.dir={d}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resuming" in p.stdout and read_status(d) == "completed"
    assert_same_run(reference, d)
    info = json.loads((d / "run.json").read_text())
    assert len(info["resumed"]) == 1 and info["resumed"][0]["from_step"] in (8, 12)
    assert info["resumed"][0]["machine"] == info["machine"]
    assert info["resumed"][0]["floats"] == info["floats"]  # same CPU, threads, torch: no warning
    assert "warning: this resume computes with another" not in p.stdout


@pytest.mark.slow  # CI time (31 s); make test-slow runs it
def test_sigterm_checkpoints_at_the_next_step_and_the_next_launch_resumes(reference, tmp_path):
    d = tmp_path / "run"
    proc = start(SIM, d, tmp_path / "first.log")
    wait_for_step(d, 6, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    st = read_status_full(d)
    assert st["status"] == "preempted" and st["signal"] == signal.SIGTERM
    assert "preempted: checkpointed at step" in (tmp_path / "first.log").read_text()
    assert torch.load(d / "checkpoint.pt", weights_only=True)["step"] == st["step"]
    p = run_here("train.py", *SIM, f"hydra.run.dir={d}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert_same_run(reference, d)


@pytest.mark.slow  # CI time (84 s); make test-slow runs it
def test_a_dead_rank_stops_the_others_marks_the_run_failed_and_relaunch_resumes(tmp_path):
    ddp = [*TINY, "dist.nproc_per_node=2"]
    ref = tmp_path / "ref"
    p = run_entry("train.py", *ddp, f"hydra.run.dir={ref}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    d = tmp_path / "run"
    proc = start(ddp, d, tmp_path / "first.log")
    wait_for_step(d, 20, proc)  # epoch 2: the epoch-1 checkpoint exists
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    pids = [int(x) for x in workers.stdout.split()]
    victims = [p for p in pids if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
    assert len(victims) == 2, pids
    t0 = time.time()
    os.kill(victims[-1], signal.SIGKILL)
    assert proc.wait(timeout=60) == 1
    assert time.time() - t0 < 60
    assert read_status(d) == "failed"
    assert "a rank process failed" in (tmp_path / "first.log").read_text()
    p = run_entry("train.py", *ddp, f"hydra.run.dir={d}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert_same_run(ref, d, predictions=False)


@pytest.mark.slow  # CI time (46 s); make test-slow runs it
def test_nan_loss_marks_the_run_diverged_and_a_multirun_goes_on(tmp_path):
    p = run_entry("train.py", *TINY, "optim.lr=1e6", "optim.momentum=0",
                  f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    assert p.returncode == 3, p.stderr[-2000:]
    st = read_status_full(tmp_path / "a")
    assert st["status"] == "diverged" and st["step"] > 0
    assert "diverged (non-finite loss) at step" in p.stderr
    p = run_entry("train.py", *TINY, "epochs=1", "optim.lr=1e6", "optim.momentum=0",
                  "on_nan=continue", f"hydra.run.dir={tmp_path / 'c'}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "bnlab: completed at step" in p.stdout  # the summary, printed despite the NaN
    losses = [r.get("train/loss") for r in metrics(tmp_path / "c") if "train/loss" in r]
    assert read_status(tmp_path / "c") == "completed" and None in losses  # NaN logged as null
    p = run_entry("train.py", "-m", *TINY, "epochs=1", "optim.lr=1e6,0.01", "optim.momentum=0",
                  f"output_dir={tmp_path / 'm'}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    runs = sorted((tmp_path / "m").rglob("status.json"))
    assert sorted(json.loads(r.read_text())["status"] for r in runs) == ["completed", "diverged"]


def test_the_summary_of_a_run_whose_last_evaluation_was_not_finite(tmp_path):
    """on_nan=continue logs NaN as null: the closing summary says so instead of failing."""
    from bnlab.jitter import MIN_EVALS
    from bnlab.metrics import summary

    def text(accs: list) -> str:
        rows = [{"step": s, "epoch": s / 4, "val/acc": a, "val/loss": a and 2.0}
                for s, a in enumerate(accs, start=1)]
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return summary(tmp_path, {"step": len(accs), "steps": len(accs), "val_images": 128})

    finite = [10.0 + i % 3 for i in range(MIN_EVALS + 1)]
    assert "jitter over the last" in text(finite) and "val acc 12.00%" in text(finite)
    last = text(finite + [None])
    assert f"val acc not finite (loss not finite) after {MIN_EVALS + 2} evaluation(s)" in last
    assert "jitter" not in last  # not over a tail holding a non-finite evaluation


# -- the run directory's rules ------------------------------------------------------------

def unfinished(tmp_path: Path, cfg: dict, status: str = "failed") -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    set_status(d, status)
    return d


@pytest.fixture
def cfg() -> dict:
    from test_configs import compose_train

    return compose_train([])


def test_resume_allows_logging_changes_and_refuses_a_different_experiment(tmp_path, cfg):
    d = unfinished(tmp_path, cfg)
    changed = json.loads(json.dumps(cfg))
    changed.update(log_every=7, progress=False, eval_every=3)
    assert resume.plan(d, changed) is True
    changed["norm"]["kind"] = "syncbn"
    changed["batch_per_gpu"] = 4
    with pytest.raises(BnlabError, match=r"batch_per_gpu \(32 -> 4\), norm.kind \('bn' -> "):
        resume.plan(d, changed)


def test_finished_live_or_refused_runs_are_never_resumed(tmp_path, cfg):
    assert resume.plan(tmp_path / "new", cfg) is False
    d = unfinished(tmp_path, cfg, "completed")
    with pytest.raises(BnlabError, match="completed run.*never overwritten"):
        resume.plan(d, cfg)
    set_status(d, "diverged", step=5)
    with pytest.raises(BnlabError, match="diverged at step 5"):
        resume.plan(d, cfg)
    set_status(d, "preempted")
    with pytest.raises(BnlabError, match="resume=never"):
        resume.plan(d, {**cfg, "resume": "never"})
    st = {"status": "running", "pid": os.getppid(), "host": os.uname().nodename}
    (d / "status.json").write_text(json.dumps(st))
    with pytest.raises(BnlabError, match=f"running now \\(pid {os.getppid()}\\)"):
        resume.plan(d, cfg)


def test_truncate_metrics_keeps_lines_up_to_the_checkpoint_and_drops_a_torn_one(tmp_path):
    lines = [{"step": s, "x": s} for s in (2, 4, 4, 6, 8)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in lines) + '{"step": 9, "x"')
    assert resume.truncate_metrics(tmp_path, 4) == 3
    kept = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert kept == lines[:3]


def test_a_stop_that_reaches_torchs_launcher_of_local_ranks_says_what_became_of_the_run(
        tmp_path):
    """`dist.nproc_per_node=N`: torch's launcher hears the stop, passes it to the ranks and
    raises, its own handler still installed. Before any rank began the run, the process dies by
    the signal (a sweep counts it not started, not failed); where the ranks checkpointed, it
    is preempted (exit 75); where they had ended the run, it says so with the run's exit
    status; where they had begun and not checkpointed, the run is marked failed and resumable
    (exit 1); each in one sentence, no traceback. Each launcher is a child forked from this
    process, torch already imported (a new interpreter each took seconds to import it)."""
    import multiprocessing
    from types import SimpleNamespace

    from torch.distributed.elastic.multiprocessing import api

    from bnlab.launch import stopped_by_signal

    def launcher(d: Path, err: Path) -> None:  # a forked child: torch is imported already
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGTERM, api._terminate_process_handler)  # as torch leaves it
        stopped_by_signal(d, signal.SIGTERM)

    def stop(name: str, status: str | None, **extra) -> tuple[SimpleNamespace, Path]:
        d = tmp_path / name
        d.mkdir()
        if status is not None:
            set_status(d, status, **extra)
        err = tmp_path / f"{name}.err"
        p = multiprocessing.get_context("fork").Process(target=launcher, args=(d, err))
        p.start()
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
            p.join()
            pytest.fail(f"the launcher ({name}) did not end in 120 s")
        out = SimpleNamespace(returncode=p.exitcode, stderr=err.read_text())
        assert "Traceback" not in out.stderr, out.stderr
        return out, d

    out, d = stop("never", None)
    assert out.returncode == -signal.SIGTERM and read_status(d) is None
    out, d = stop("checkpointed", "preempted", step=378)
    assert out.returncode == 75 and out.stderr.count("\n") == 1
    assert "preempted: checkpointed at step 378" in out.stderr and read_status(d) == "preempted"
    for status, rc in (("completed", 0), ("diverged", 3)):
        out, d = stop(status, status)
        assert out.returncode == rc and read_status(d) == status
        assert out.stderr == f"bnlab: SIGTERM came after the run had ended ({status}): {d}.\n"
    out, d = stop("began", "running")
    assert out.returncode == 1 and out.stderr.startswith("bnlab: error: stopped by SIGTERM")
    assert out.stderr.count("\n") == 1 and read_status(d) == "failed"


@pytest.mark.slow  # CI time (3.4 min each beside a sweep); make test-slow runs it
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_a_stop_to_python_train_py_with_local_ranks_checkpoints_them_and_resumes(tmp_path, sig):
    """SIGTERM, or SIGUSR2 (SLURM's warning, which torch's launcher does not handle by
    default), to `python train.py dist.nproc_per_node=2` mid-training: its ranks checkpoint, the
    run is preempted (exit 75, one sentence, no traceback), and relaunching ends it."""
    d = tmp_path / "run"
    ddp = [*TINY, "epochs=40", "dist.nproc_per_node=2"]
    proc = start(ddp, d, tmp_path / "first.log")
    wait_for_step(d, 40, proc)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == 75
    log = (tmp_path / "first.log").read_text()
    assert "bnlab: preempted: checkpointed at step" in log and "Traceback" not in log, log[-2000:]
    assert read_status_full(d)["status"] == "preempted"
    p = run_entry("train.py", *ddp, f"hydra.run.dir={d}", cwd=tmp_path)
    assert p.returncode == 0 and read_status(d) == "completed", p.stderr[-2000:]
