"""A sweep's runs as submitit jobs: on this machine (`LocalExecutor`) or on SLURM.

Each job is one `train.py` run (a `TrainJob`), started as a child process so that the run
keeps every launcher it has (one process, simulated ranks, N local ranks, or one rank per
SLURM task). The job forwards a stop to its run and reports how the run ended:

- SIGTERM (the sweep stopped by SIGTERM or Ctrl-C, or SLURM cancelling the job): the run
  checkpoints and stops as `preempted`; the same sweep command resumes it.
- submitit's preemption signal (SIGUSR2, sent by SLURM `--signal` before the time limit or on
  preemption): the run checkpoints, and submitit requeues the job, which resumes the run from
  its checkpoint (`checkpoint` below).

Each launch adds its wall time to the run's `sweep.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bnlab.rundir import read_status

LAUNCHERS = ("local", "slurm")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
LOCAL_TIMEOUT_MIN = 60 * 24 * 30  # no time limit on this machine (submitit's default is 2 min)


@dataclass
class TrainJob:
    """One `train.py` run in `run_dir`; calling it runs (or resumes) the run and returns
    `{"status": ..., "wall_s": ...}` for this launch."""

    cmd: list[str]
    run_dir: str
    cwd: str
    label: str
    seed: int
    threads: int
    jobs: int  # runs side by side (recorded in sweep.json)
    _proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    _rc: int | None = field(default=None, repr=False, compare=False)
    _stopping: bool = field(default=False, repr=False, compare=False)
    _t0: float = field(default=0.0, repr=False, compare=False)
    LIVE = ("_proc", "_rc", "_stopping", "_t0")  # this launch's state: never pickled

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self.LIVE}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _proc=None, _rc=None, _stopping=False, _t0=0.0)

    def _wait(self) -> int:
        """The run's exit status. A thread reaps the process and this loop only sleeps, so a
        signal handler (checkpoint) can wait too without taking Popen's lock twice."""
        while self._rc is None:
            time.sleep(0.2)
        return self._rc

    def __call__(self) -> dict:
        d = Path(self.run_dir)
        d.mkdir(parents=True, exist_ok=True)
        before = self._record_before()
        # After submitit's own handlers: SIGTERM reaches the run. SIGINT is left as the sweep
        # set it (ignored), so Ctrl-C in a terminal reaches the sweep only, which stops the jobs.
        signal.signal(signal.SIGTERM, self._forward)
        self._t0 = time.perf_counter()
        with open(d / "train.log", "a" if before else "w") as log:
            proc = self._proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdout=log,
                                                 stderr=subprocess.STDOUT,
                                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
            threading.Thread(target=lambda: setattr(self, "_rc", proc.wait()), daemon=True).start()
            rc = self._wait()
        wall = time.perf_counter() - self._t0
        if rc == -signal.SIGTERM and self._stopping and read_status(d) is None and not before:
            # The stop came before train.py could handle it: the run never began.
            shutil.rmtree(d)
            return {"status": "not started", "wall_s": 0.0}
        status = read_status(d) or "failed"
        if rc != 0 and status == "running":
            status = "failed"
        self._record(before, rc, wall)
        return {"status": status, "wall_s": wall}

    def _forward(self, signum, frame) -> None:
        """A stop asked of the job: train.py checkpoints at its next step and leaves."""
        self._stopping = True
        if self._proc is not None and self._rc is None:
            self._proc.send_signal(signal.SIGTERM)

    def checkpoint(self, *args, **kwargs):
        """submitit's preemption hook (SIGUSR2 on SLURM): let the run checkpoint, record this
        launch, and hand submitit the same job to requeue; it resumes the run."""
        from submitit.helpers import DelayedSubmission

        if self._proc is not None:
            before = self._record_before()
            self._forward(signal.SIGTERM, None)
            self._record(before, self._wait(), time.perf_counter() - self._t0)
            self._proc = None
        return DelayedSubmission(TrainJob(self.cmd, self.run_dir, self.cwd, self.label,
                                          self.seed, self.threads, self.jobs))

    def _record_before(self) -> dict:
        f = Path(self.run_dir) / "sweep.json"
        return json.loads(f.read_text()) if f.is_file() else {}

    def _record(self, before: dict, rc: int, wall: float) -> None:
        """sweep.json: this cell and seed, the last exit status, and the wall time and number
        of every launch so far."""
        rec = {"cell": self.label, "seed": self.seed, "rc": rc,
               "wall_s": round(before.get("wall_s", 0.0) + wall, 1), "threads": self.threads,
               "jobs": self.jobs, "launches": before.get("launches", 1 if before else 0) + 1,
               "gpus": os.environ.get("CUDA_VISIBLE_DEVICES") or None}
        (Path(self.run_dir) / "sweep.json").write_text(json.dumps(rec) + "\n")


@dataclass
class Slurm:
    """What each SLURM job asks for (`--launcher slurm` and its options)."""

    partition: str | None = None
    nodes: int = 1
    tasks_per_node: int | None = None  # default: the run's ranks (dist.nproc_per_node) / nodes
    gpus_per_node: int = 0
    cpus_per_task: int | None = None  # default: the threads each run gets
    time_min: int = 24 * 60
    signal_delay_s: int = 120
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: list[str] = field(default_factory=list)  # shell lines before the job (module load)

    def parameters(self, ranks: int, threads: int, array_parallelism: int) -> dict:
        tasks = self.tasks_per_node or max(1, ranks // self.nodes)
        p = {"nodes": self.nodes, "ntasks_per_node": tasks, "gpus_per_node": self.gpus_per_node,
             "cpus_per_task": self.cpus_per_task or threads, "time": self.time_min,
             "signal_delay_s": self.signal_delay_s, "array_parallelism": array_parallelism,
             "job_name": "bnlab", "setup": list(self.setup)}
        for k in ("partition", "account", "qos", "constraint"):
            if getattr(self, k):
                p[k] = getattr(self, k)
        if not self.gpus_per_node:
            p.pop("gpus_per_node")
        return p


def executor(launcher: str, folder: Path, *, ranks: int = 1, threads: int = 1,
             jobs: int = 1, slurm: Slurm | None = None):
    """The submitit executor that runs a sweep's jobs; its logs and pickles go to `folder`
    (`%j` is the job id)."""
    import submitit

    if launcher == "local":
        ex = submitit.LocalExecutor(folder=str(folder))
        ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN, tasks_per_node=1)
        return ex
    ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=3)
    ex.update_parameters(**(slurm or Slurm()).parameters(ranks, threads, jobs))
    return ex
