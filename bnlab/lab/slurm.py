"""A sweep's runs on a SLURM cluster: what each job asks for, one job array per number of
ranks, and the wait that follows them.

    python -m bnlab.lab.sweep experiments/jitter/sweep.yaml --launcher slurm --partition gpu \\
        --gpus-per-node 1 --time 240 --jobs 16

Each run's job id is recorded in its directory (job.json), so a later command follows a run
still queued or running there instead of submitting it twice. A job warned of its time limit
or preempted (SIGUSR2, `--signal-delay` seconds ahead) checkpoints its run and is requeued,
and resumes it (`bnlab/lab/jobs.py`).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bnlab.errors import BnlabError
from bnlab.lab.jobs import POLL_S, Stop, TrainJob, job_result

JOB_RECORD = "job.json"  # the SLURM job a run was last submitted as
# SLURM states of a job that is (or may be) still queued or running: never submitted again,
# followed instead. A job neither sacct nor squeue knows (accounting off or purged) is gone.
# (PREEMPTED is final: a job SLURM requeues after preempting it shows PENDING or REQUEUED.)
SLURM_ALIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
               "COMPLETING", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")
SLURM_POLL_S = 30.0


@dataclass
class Slurm:
    """What each SLURM job asks for (`--launcher slurm` and its options)."""

    partition: str | None = None
    nodes: int = 1
    tasks_per_node: int | None = None  # default: the run's ranks (dist.nproc_per_node) / nodes
    gpus_per_node: int = 0  # at most one per task is asked
    cpus_per_task: int | None = None  # default: the threads each run gets
    time_min: int = 24 * 60
    signal_delay_s: int = 120
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    setup: list[str] = field(default_factory=list)  # shell lines before the job (module load)

    def layout(self, ranks: int) -> tuple[int, int]:
        """(nodes, tasks per node) for a run of `ranks` ranks, one rank per task. A one-rank
        run (the simulation included) takes one task on one node whatever was asked."""
        if ranks == 1:
            return 1, 1
        tasks = self.tasks_per_node or ranks // self.nodes
        if self.nodes * tasks != ranks:
            raise BnlabError(
                f"a run with {ranks} ranks (dist.nproc_per_node={ranks}) cannot be laid out as "
                f"--nodes {self.nodes} x --tasks-per-node {tasks}; give nodes and tasks per "
                f"node whose product is {ranks}.")
        if self.gpus_per_node and self.gpus_per_node < tasks:
            raise BnlabError(
                f"--gpus-per-node {self.gpus_per_node} is fewer than the {tasks} ranks per "
                f"node of a {ranks}-rank run (one GPU each); ask for at least {tasks}, or "
                "for none to train on CPU.")
        return self.nodes, tasks

    def parameters(self, ranks: int, threads: int, array_parallelism: int) -> dict:
        """submitit's SlurmExecutor parameters for the runs of `ranks` ranks: one task per
        rank, and one GPU per task where GPUs were asked."""
        nodes, tasks = self.layout(ranks)
        cpus = self.cpus_per_task or threads
        # srun is given the CPUs per task again: from SLURM 22.05 to 23.02 a step does not
        # inherit the job's --cpus-per-task, and each rank would be bound to one CPU.
        p = {"nodes": nodes, "ntasks_per_node": tasks,
             "gpus_per_node": min(self.gpus_per_node, tasks),
             "cpus_per_task": cpus, "srun_args": ["--cpus-per-task", str(cpus)],
             "time": self.time_min, "signal_delay_s": self.signal_delay_s,
             "array_parallelism": array_parallelism, "job_name": "bnlab",
             "setup": list(self.setup)}
        for k in ("partition", "account", "qos", "constraint"):
            if getattr(self, k):
                p[k] = getattr(self, k)
        if not self.gpus_per_node:
            p.pop("gpus_per_node")
        return p

    def executor(self, folder: Path, ranks: int, threads: int, jobs: int):
        """submitit's executor for the runs of `ranks` ranks, `jobs` at a time; its logs and
        pickles go to `folder` (`%j` is the job id)."""
        import submitit

        ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=3)
        ex.update_parameters(**self.parameters(ranks, threads, jobs))
        return ex



def slurm_states(dirs: list[Path]) -> dict[Path, str]:
    """The runs among `dirs` whose last SLURM job (job.json) is still queued or running there,
    with its state: one sacct call for them all; squeue for those sacct does not know (a
    cluster without accounting). A job whose first task has reported has ended."""
    from submitit.core.utils import JobPaths
    from submitit.slurm.slurm import SlurmInfoWatcher

    recs = {d: json.loads((d / JOB_RECORD).read_text()) for d in dirs
            if (d / JOB_RECORD).is_file()}
    recs = {d: r for d, r in recs.items()
            if not JobPaths(r["folder"], r["job_id"], task_id=0).result_pickle.exists()}
    if not recs:
        return {}
    watcher = SlurmInfoWatcher()  # a new one: submitit's shared one keeps states sacct dropped
    for r in recs.values():
        watcher.register_job(r["job_id"])
    watcher.update()
    states, unknown = {}, []
    for d, r in recs.items():
        state = (watcher.get_state(r["job_id"], mode="cache").split() or ["UNKNOWN"])[0]
        if state == "UNKNOWN":
            unknown.append(d)
        elif state in SLURM_ALIVE:
            states[d] = state
    if unknown:
        queued = squeue({recs[d]["job_id"].split("_")[0] for d in unknown})
        for d in unknown:  # squeue could not be asked: still there, never submitted twice
            if queued is None or recs[d]["job_id"] in queued:
                states[d] = "UNKNOWN" if queued is None else queued[recs[d]["job_id"]]
    return states


def squeue(ids: set[str]) -> dict[str, str] | None:
    """Job id -> state of the jobs among `ids` (array tasks one by one) that SLURM's queue
    holds; None where squeue cannot be asked."""
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T", "-j", ",".join(sorted(ids))],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 and "Invalid job id" not in out.stderr:
        return None
    return dict(line.split()[:2] for line in out.stdout.splitlines() if len(line.split()) >= 2)


def submit_slurm(todo, runs: list[TrainJob], folder: Path, jobs: int, threads: int,
                 slurm: Slurm, wait: bool, on_slurm=()) -> dict[str, int]:
    """Submit the runs as SLURM job arrays, one per number of ranks (each at most `jobs` at a
    time; submitit's logs under `folder`), and record each run's job id in its directory;
    with `wait`, follow them, and the runs `on_slurm` (submitted by an earlier command, still
    queued or running), until they end."""
    from submitit import SlurmJob

    if not runs and not on_slurm:
        return {}
    ranks = {c.cfg["dist"]["nproc_per_node"] for c, _, _ in todo}
    counts: dict[str, int] = {}
    submitted = []
    for n in sorted(ranks):  # one array per number of ranks: each asks for its own tasks
        group = [(t, r) for t, r in zip(todo, runs, strict=True)
                 if t[0].cfg["dist"]["nproc_per_node"] == n]
        ex = slurm.executor(folder, n, threads, jobs)
        with ex.batch():
            pending = [ex.submit(r) for _, r in group]
        for ((cell, seed, d), _), job in zip(group, pending, strict=True):
            d.mkdir(parents=True, exist_ok=True)
            (d / JOB_RECORD).write_text(json.dumps(
                {"launcher": "slurm", "job_id": job.job_id, "folder": str(job.paths.folder),
                 "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
            print(f"  submitted {cell.label} seed {seed} as SLURM job {job.job_id}  {d}")
            submitted.append((job, cell, seed, d))
    if not wait:
        return {k: v for k, v in (("submitted", len(submitted)), ("on SLURM", len(on_slurm)))
                if v}
    followed = []
    for cell, seed, d in on_slurm:
        rec = json.loads((d / JOB_RECORD).read_text())
        followed.append((SlurmJob(rec["folder"], rec["job_id"]), cell, seed, d))
    with Stop() as stop:
        live = submitted + followed
        while live and not stop.asked:
            # Ended: its first task reported, or SLURM no longer holds it (killed, node lost,
            # out of requeues; asked of squeue too where sacct keeps no accounts). The same
            # question the next command asks, in one sacct call for every job.
            there = slurm_states([x[3] for x in live])
            for item in [x for x in live if x[3] not in there]:
                live.remove(item)
                status, _ = job_result(item[0], item[3])
                counts[status] = counts.get(status, 0) + 1
                print(f"  {status:9s} {item[1].label} seed {item[2]}  {item[3]}")
            until = time.monotonic() + SLURM_POLL_S
            while not stop.asked and time.monotonic() < until:
                time.sleep(POLL_S)
        if stop.asked:  # queued jobs go first (none starts meanwhile), then running ones
            ids = [job.job_id for job, *_ in live]  # checkpoint (SIGTERM reaches train.py)
            for how in (["--state=PENDING"], ["--signal=TERM", "--state=RUNNING"]):
                subprocess.run(["scancel", *how, *ids], capture_output=True)  # gone: fine
            counts["preempted"] = len(live)
    return counts
