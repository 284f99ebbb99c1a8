"""A sweep's runs as submitit jobs, on this machine (`bnlab/lab/local.py`) or on SLURM
(`bnlab/lab/slurm.py`), and the sweep's side of them: its stop, and how a job's run ended.

Each job is one `train.py` run (a `TrainJob`), started as a child process so that the run
keeps every launcher it has (one process, simulated ranks, N local ranks, or one rank per
SLURM task). The job forwards a stop to its run and reports how the run ended:

- SIGTERM (the sweep stopped by SIGTERM or Ctrl-C; SLURM cancelling or preempting the job):
  the run checkpoints and stops as `preempted`; the same sweep command resumes it (or SLURM's
  own requeue, where the cluster preempts by requeueing).
- submitit's preemption signal (SIGUSR2, sent by SLURM `--signal` before the time limit): the
  run checkpoints, and submitit requeues the job, which resumes the run from its checkpoint
  (`checkpoint` below).

The run is started in a session of its own, so Ctrl-C in a terminal reaches the sweep (which
stops the jobs in order) and never the run's ranks directly. In a SLURM job of several tasks
(one per rank) each task runs this; only the first writes `train.log` and `sweep.json`.
Each launch adds its wall time to the run's `sweep.json`.

The sweep reads how a job's run ended from the job's report, else, where the job died
without one, from the run's own status (`job_result`); the job and the sweep both take that
status through `bnlab.rundir.ended_as`.
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

from bnlab.checkpoint import CHECKPOINT
from bnlab.preempt import StopRequest
from bnlab.rundir import FINAL, ended_as, read_status

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
NOT_STARTED = "not started"  # a job stopped before its run began: no status, nothing to resume
POLL_S = 0.5  # how often a sweep that waits for its jobs looks at them, and at its stop


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
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES for the run (local sweeps); None: as given
    _proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    _rc: int | None = field(default=None, repr=False, compare=False)
    _stopping: bool = field(default=False, repr=False, compare=False)
    _signalled: bool = field(default=False, repr=False, compare=False)
    _recorded: bool = field(default=False, repr=False, compare=False)
    _before: dict = field(default_factory=dict, repr=False, compare=False)
    _t0: float = field(default=0.0, repr=False, compare=False)
    LIVE = {"_proc": None, "_rc": None, "_stopping": False, "_signalled": False,
            "_recorded": False, "_before": {}, "_t0": 0.0}  # this launch's: never pickled

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self.LIVE}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, **{k: (dict(v) if isinstance(v, dict) else v)
                                       for k, v in self.LIVE.items()})

    def _wait(self) -> int:
        """The run's exit status. A thread reaps the process and this loop only sleeps, so a
        signal handler (checkpoint) can wait too without taking Popen's lock twice."""
        while self._rc is None:
            time.sleep(0.2)
        return self._rc

    def __call__(self) -> dict:
        d = Path(self.run_dir)
        d.mkdir(parents=True, exist_ok=True)
        rank = task_rank()  # a SLURM job with one task per rank runs this once per task
        # After submitit's own handlers: SIGTERM reaches the run. SIGINT is left as the sweep
        # set it (ignored), so Ctrl-C in a terminal reaches the sweep only, which stops the jobs.
        signal.signal(signal.SIGTERM, self._forward)
        self._before = self._record_before() if rank == 0 else {}
        self._t0 = time.perf_counter()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.gpus is not None:  # submitit's local controller sets its own; the sweep's wins
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        name = "train.log" if rank == 0 else f"train.rank{rank}.log"
        with open(d / name, "a" if self._before or rank else "w") as log:
            # Its own session: Ctrl-C in the terminal never reaches the run's ranks directly.
            proc = self._proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdout=log,
                                                 stderr=subprocess.STDOUT, env=env,
                                                 start_new_session=True)
            threading.Thread(target=lambda: setattr(self, "_rc", proc.wait()), daemon=True).start()
            if self._stopping:  # the stop came while the run was being started
                self._signal_run()
            rc = self._wait()
        wall = time.perf_counter() - self._t0
        if rc == -signal.SIGTERM and self._stopping and read_status(d) is None and \
                not self._before and rank == 0 and task_count() == 1:
            # The stop came before train.py could handle it: the run never began.
            shutil.rmtree(d)
            return {"status": NOT_STARTED, "wall_s": 0.0}
        status = ended_as(read_status(d), rc)
        if rank == 0:
            self._record(rc, wall)
        return {"status": status, "wall_s": wall}

    def _signal_run(self) -> None:
        """SIGTERM to the run, once: train.py checkpoints at its next step and leaves."""
        if self._proc is not None and self._rc is None and not self._signalled:
            self._signalled = True
            self._proc.send_signal(signal.SIGTERM)

    def _forward(self, signum, frame) -> None:
        """A stop asked of the job (the sweep may ask more than once; the run hears it once)."""
        self._stopping = True
        self._signal_run()

    def checkpoint(self, *args, **kwargs):
        """submitit's preemption hook (SIGUSR2 on SLURM; in a job of several tasks only the
        first task's): let the run checkpoint (its ranks agree to stop at one step), record
        this launch, and hand submitit the same job to requeue; it resumes the run. A run that
        has already ended is not requeued (None): the sweep reads its status."""
        from submitit.helpers import DelayedSubmission

        if self._proc is None:
            return DelayedSubmission(self)
        self._forward(signal.SIGTERM, None)
        self._record(self._wait(), time.perf_counter() - self._t0)
        # SLURM may have signalled the run itself too, and it may have stopped first: whether
        # it still has work is its status, not whether it had exited before this. A run that
        # failed is requeued too: it resumes from its last checkpoint, as the sweep would.
        if read_status(Path(self.run_dir)) in FINAL:
            return None
        self._proc = None
        return DelayedSubmission(self)  # pickled without this launch's state (LIVE)

    def _record_before(self) -> dict:
        f = Path(self.run_dir) / "sweep.json"
        return json.loads(f.read_text()) if f.is_file() else {}

    def _record(self, rc: int, wall: float) -> None:
        """sweep.json, once per launch: this cell and seed, the last exit status, and the wall
        time and number of every launch so far."""
        if self._recorded:
            return
        self._recorded = True
        before = self._before
        gpus = self.gpus if self.gpus is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        rec = {"cell": self.label, "seed": self.seed, "rc": rc,
               "wall_s": round(before.get("wall_s", 0.0) + wall, 1), "threads": self.threads,
               "jobs": self.jobs, "launches": before.get("launches", 1 if before else 0) + 1,
               "gpus": gpus or None}
        (Path(self.run_dir) / "sweep.json").write_text(json.dumps(rec) + "\n")


def task_rank() -> int:
    """This task's place in its job (SLURM_PROCID under SLURM; 0 for a one-task job)."""
    return int(os.environ.get("SLURM_PROCID", "0")) if task_count() > 1 else 0


def task_count() -> int:
    """Tasks of this SLURM job step (one per rank); 1 outside a submitit SLURM job."""
    env = os.environ
    if env.get("SUBMITIT_EXECUTOR") != "slurm":
        return 1
    return int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)


class Stop(StopRequest):
    """SIGTERM or Ctrl-C while the sweep runs: nothing new starts and every running job is
    asked to checkpoint. The jobs themselves ignore Ctrl-C from the terminal (they inherit an
    ignored SIGINT), so the sweep is the one that stops them, in order."""

    def __init__(self):
        super().__init__(STOP_SIGNALS)

    @property
    def asked(self) -> bool:
        return self.signum != 0

    def submit(self, ex, job: TrainJob):
        """Submit with SIGINT ignored, so that the job's processes inherit it ignored."""
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if self._old else None
        try:
            return ex.submit(job)
        finally:
            if old is not None:
                signal.signal(signal.SIGINT, old)


def resumable(d: Path) -> bool:
    """An unfinished run that can continue where it stopped: it left a checkpoint."""
    return (d / CHECKPOINT).is_file()


def job_result(job, d: Path, stopping: bool = False) -> tuple[str, float]:
    """How a finished job's run ended: the report of the job's first task (rank 0), else the
    run's status.json. A job stopped by the sweep before its run began is `not started`."""
    try:  # result() would wait for a report that never comes (a job SLURM dropped unseen)
        first = job.task(0)
        if first.paths.result_pickle.exists():
            res = first.result()
            return res["status"], res["wall_s"]
    except Exception:  # a report that is an error: read the run's own status
        pass
    # No report: the job died (killed, out of memory, node lost, stopped early).
    status = read_status(d)
    if stopping and status is None and not resumable(d):
        return NOT_STARTED, 0.0
    return ended_as(status), 0.0
