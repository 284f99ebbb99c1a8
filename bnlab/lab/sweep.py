"""Run an experiment's grid (cells x seeds) as separate `train.py` runs, N at a time, as
submitit jobs: on this machine (the default) or on a SLURM cluster.

    python -m bnlab.lab.sweep experiments/jitter/sweep.yaml --data ../shared/data/cifar10-mini
    python -m bnlab.lab.sweep experiments/jitter/sweep.yaml --launcher slurm --partition gpu \\
        --gpus-per-node 1 --time 240 --jobs 16

(`make table-<name>` runs its table's sweep through `python -m bnlab.claims <name>`.)

A sweep spec (`experiments/<name>/sweep.yaml`) names a Hydra experiment config, the seeds,
and its cells (a label and the overrides that make the cell). Each cell is composed first,
so a typo fails before anything runs. A run's directory is named by a hash of its resolved
config (keys that cannot change the result left out), under `experiments/runs/<data tag>/`:
tables that share a cell share its runs, and a run that has finished (completed or
diverged) is never run again, so an interrupted sweep picks up where it stopped.

SIGTERM or Ctrl-C stops the sweep cleanly: each running job checkpoints and stops as
`preempted`, and the same command later resumes those runs from their checkpoints (a run
left unfinished without a checkpoint is set aside and run again). On SLURM, a job warned of
its time limit or preempted (SIGUSR2, `--signal-delay` seconds ahead) checkpoints its run and
is requeued, and resumes it (`bnlab/lab/jobs.py`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tqdm import tqdm

from bnlab.checkpoint import CHECKPOINT
from bnlab.cli import run_cli
from bnlab.config import NOT_EXPERIMENT, without, without_added_later
from bnlab.errors import BnlabError
from bnlab.lab.jobs import FINAL, LAUNCHERS, STOP_SIGNALS, Slurm, TrainJob, executor
from bnlab.paths import CONFIGS, ROOT, RUNS, shown
from bnlab.preempt import StopRequest
from bnlab.rundir import git_commit, machine, read_status

RUN_ONLY = ["progress=false", "checkpoint=true", "resume=auto"]
PREEMPTED = 75  # the sweep's exit status when stopped by a signal (as train.py's)
SUBMITIT = ".submitit"  # submitit's folder of job pickles and logs, under runs/<tag>/
JOB_RECORD = "job.json"  # the SLURM job a run was last submitted as
# SLURM states of a job that is (or may be) still queued or running: never submitted again,
# followed instead. A job neither sacct nor squeue knows (accounting off or purged) is gone.
# (PREEMPTED is final: a job SLURM requeues after preempting it shows PENDING or REQUEUED.)
SLURM_ALIVE = ("PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING",
               "COMPLETING", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT")
POLL_S, SLURM_POLL_S = 0.5, 30.0
RESEND_S = 5.0  # while a sweep stops, each running job is asked again this often
ALLOW_DIRTY = "BNLAB_ALLOW_DIRTY"  # set (or --allow-dirty): runs from uncommitted code allowed


@dataclass
class Cell:
    label: str
    overrides: list[str]
    seeds: list[int]
    cfg: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)  # the spec's other keys (row, col, section...)

    @property
    def key(self) -> str:
        """`<model>-<norm>-<ranks>x<batch>-<hash>`: readable, and unique per resolved config."""
        c = without_added_later(without(self.cfg, (*NOT_EXPERIMENT, "seed")))
        digest = hashlib.sha1(json.dumps(c, sort_keys=True).encode()).hexdigest()[:10]
        world = self.cfg["dist"]["simulate"] * self.cfg["dist"]["nproc_per_node"]
        return (f"{self.cfg['model']['name']}-{self.cfg['norm']['kind']}-{world}x"
                f"{self.cfg['batch_per_gpu']}-{digest}")


@dataclass
class Spec:
    name: str
    title: str
    experiment: str
    cells: list[Cell]
    path: Path
    extra: dict = field(default_factory=dict)


def compose(overrides: list[str], here: bool = True) -> dict:
    """The resolved training config for these overrides, as train.py would build it (checked
    against this machine's devices unless `here` is False: runs that train elsewhere)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from bnlab import hydra_setup
    from bnlab.config import validate

    hydra_setup.register()
    try:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            cfg = OmegaConf.to_container(hydra_compose("train", overrides=overrides),
                                         resolve=True)
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0]
        raise BnlabError(f"the overrides {' '.join(overrides)} do not compose: {first}") from e
    validate(cfg, here)
    return cfg


def data_overrides(data: str | None) -> list[str]:
    """`--data DIR` reads CIFAR-10 from DIR and never downloads; without it, the default."""
    return [f"data.root={Path(data).resolve()}", "data.download=false"] if data else []


def load_spec(path: Path, data: str | None = None, here: bool = True) -> Spec:
    path = Path(path)
    if not path.is_file():
        raise BnlabError(f"no sweep spec at {path}; give experiments/<name>/sweep.yaml.")
    return spec_from(yaml.safe_load(path.read_text()), path, data, here=here)


def spec_from(raw: dict, path: Path, data: str | None = None, name: str | None = None,
              here: bool = True) -> Spec:
    """A spec from its parsed YAML; its name is `name`, else the folder of `path`. `here`:
    its runs train on this machine (False: on SLURM's)."""
    exp, seeds = raw["experiment"], raw.get("seeds", [0, 1, 2])
    cells = []
    for c in raw["cells"]:
        ov = [f"experiment={exp}", *c.get("overrides", [])]
        meta = {k: v for k, v in c.items() if k not in ("label", "overrides", "seeds")}
        cell = Cell(c["label"], ov, c.get("seeds", seeds), meta=meta)
        cell.cfg = compose(ov + data_overrides(data), here)
        cells.append(cell)
    extra = {k: v for k, v in raw.items() if k not in ("title", "experiment", "seeds", "cells")}
    name = name or path.parent.name
    return Spec(name, raw.get("title", name), exp, cells, path, extra)


def data_tag(cfg: dict) -> str:
    """Which data the runs saw: `cifar10-<training images>` (or `synthetic-<n>`)."""
    from bnlab.config import check_data
    from bnlab.data import build_dataset

    check_data(cfg)
    d = build_dataset({**cfg["data"], "holdout": 0})  # a held-out split is part of the config
    return f"{cfg['data']['name']}-{len(d.train)}"


def read_hosts(folder: Path) -> dict[str, list[str]]:
    """hosts.json read back: each host name -> every machine seen under it (a file written
    before one name could stand for several machines holds one description per name)."""
    f = folder / "hosts.json"
    raw = json.loads(f.read_text()) if f.is_file() else {}
    return {h: [m] if isinstance(m, str) else list(m) for h, m in raw.items()}


def record_host(folder: Path) -> None:
    """Add this machine under this host name to hosts.json, where runs are about to train.
    Runs since run.json named its machine are described by that; this file describes the
    older ones, which named only their host."""
    hosts, here = read_hosts(folder), machine()
    seen = hosts.setdefault(socket.gethostname(), [])
    if here not in seen:
        seen.append(here)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts.json").write_text(json.dumps(hosts, indent=2, sort_keys=True) + "\n")


def run_dir(tag: str, cell: Cell, seed: int, root: Path = RUNS) -> Path:
    return root / tag / cell.key / f"seed{seed}"


def set_aside(d: Path) -> Path:
    """Move an unfinished run out of the way (kept, never deleted) so it can run again."""
    i = 1
    while (dest := d.with_name(f"{d.name}.unfinished-{i}")).exists():
        i += 1
    d.rename(dest)
    return dest


def resumable(d: Path) -> bool:
    """An unfinished run that can continue where it stopped: it left a checkpoint."""
    return (d / CHECKPOINT).is_file()


def plan(specs: Spec | list[Spec], tag: str, root: Path = RUNS) -> list[tuple[Cell, int, Path]]:
    """Every (cell, seed, dir), each dir once: cells with a higher `order` last, then
    seed-major, so early results cover every cell."""
    specs = [specs] if isinstance(specs, Spec) else specs
    cells = [c for s in specs for c in s.cells]
    seen, out = set(), []
    for order in sorted({c.meta.get("order", 0) for c in cells}):
        for seed in sorted({s for c in cells for s in c.seeds}):
            for cell in cells:
                d = run_dir(tag, cell, seed, root)
                if cell.meta.get("order", 0) == order and seed in cell.seeds and d not in seen:
                    seen.add(d)
                    out.append((cell, seed, d))
    return out


def train_job(cell: Cell, seed: int, d: Path, data: str | None, threads: int, jobs: int,
              extra: list[str]) -> TrainJob:
    """The `train.py` command of one run (resuming the run in `d` if it has a checkpoint)."""
    cmd = [sys.executable, str(ROOT / "train.py"), *cell.overrides, *data_overrides(data),
           f"seed={seed}", f"hydra.run.dir={d}", f"dist.threads={threads}", *RUN_ONLY, *extra]
    return TrainJob(cmd, str(d), str(ROOT), cell.label, seed, threads, jobs)


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
        return "not started", 0.0
    return ("failed" if status in (None, "running") else status), 0.0


def refuse_dirty() -> None:
    """Runs that a table reports come from committed code only: a working tree with
    uncommitted changes to tracked files would leave runs whose code nobody can check out."""
    commit = git_commit()
    if commit is not None and commit.endswith("-dirty"):
        raise BnlabError(f"the working tree at {ROOT} has uncommitted changes, so its runs "
                         "could not be traced to a commit; commit or stash them (or pass "
                         "--allow-dirty for a trial whose runs are never committed).")


def submit_folder(root: Path, tag: str) -> Path:
    """Where submitit keeps each job's pickles and logs (ignored by git): one folder per
    sweep command, so a job id (a process id, on this machine) never meets an older one."""
    here = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return root / tag / SUBMITIT / here / "%j"


def sweep(specs: list[Spec], data: str | None, jobs: int, extra: list[str] | None = None,
          root: Path = RUNS, launcher: str = "local", slurm: Slurm | None = None,
          wait: bool = True, gpus: int | None = None,
          allow_dirty: bool | None = None) -> dict[str, int]:
    """Run every unfinished run of `specs` through submitit, `jobs` at a time; returns how
    many ended how. On this machine each run gets GPUs of its own (`gpus`, default every
    visible one; as many as its ranks), and waits while too few are free. `launcher="slurm"`
    submits them as one SLURM job array instead (with `slurm`'s resources; `wait=False`
    returns once they are submitted). Runs start only from a clean working tree unless
    `allow_dirty` (or BNLAB_ALLOW_DIRTY) says otherwise."""
    tag = data_tag(specs[0].cells[0].cfg)
    name = "+".join(s.name for s in specs)
    if launcher == "slurm":  # every run's layout, before anything is moved or submitted
        for n in sorted({c.cfg["dist"]["nproc_per_node"] for s in specs for c in s.cells}):
            (slurm or Slurm()).layout(n)
    todo, on_slurm = [], []
    planned = [(c, s, d, read_status(d)) for c, s, d in plan(specs, tag, root)]
    states = slurm_states([d for *_, d, status in planned if status not in FINAL]) \
        if launcher == "slurm" else {}
    for cell, seed, d, status in planned:
        if status in FINAL:
            continue
        if d in states:  # submitted before and still there: followed, never submitted twice
            print(f"still {states[d]} on SLURM, not submitted again: {d}")
            on_slurm.append((cell, seed, d))
            continue
        if d.exists() and not resumable(d):
            print(f"set aside unfinished run: {set_aside(d)}")
        elif d.exists():
            print(f"will resume {status or 'unfinished'} run: {d}")
        todo.append((cell, seed, d))
    if todo and not (allow_dirty or os.environ.get(ALLOW_DIRTY)):
        refuse_dirty()
    if todo and launcher == "local":
        record_host(root / tag)
    total = len(planned)
    where = f"{jobs} job(s) in parallel" if launcher == "local" else \
        f"SLURM, at most {jobs} at a time"
    left = f", {len(on_slurm)} still on SLURM" if on_slurm else ""
    print(f"{name}: {total - len(todo) - len(on_slurm)} of {total} runs already done under "
          f"{root / tag}{left}; running {len(todo)} with {where}")
    threads = max(1, (os.cpu_count() or 1) // jobs) if launcher == "local" else \
        (slurm or Slurm()).cpus_per_task or 1
    runs = [train_job(c, s, d, data, threads, jobs, extra or []) for c, s, d in todo]
    if launcher == "slurm":
        return submit_slurm(todo, runs, submit_folder(root, tag), jobs, threads,
                            slurm or Slurm(), wait, on_slurm)
    counts: dict[str, int] = {}
    queue = list(zip(todo, runs, strict=True))
    running: dict = {}
    ex = executor("local", submit_folder(root, tag))
    free, held = gpu_ids(torch_gpus() if gpus is None else gpus), {}  # ids not in use; job ->
    n_gpus = len(free)
    if any(needs(c, n_gpus) > n_gpus for c, _, _ in todo):
        raise BnlabError(f"a run needs more GPUs than the {n_gpus} visible here; run it on a "
                         "machine with more, or with --launcher slurm.")
    with Stop() as stop, tqdm(total=len(todo), desc=name, unit="run", dynamic_ncols=True) as bar:
        asked_at = 0.0  # when the running jobs were last asked to stop
        while queue or running:
            while queue and len(running) < jobs and not stop.asked and \
                    needs(queue[0][0][0], n_gpus) <= len(free):
                (cell, seed, d), run = queue.pop(0)
                ids = [free.pop(0) for _ in range(needs(cell, n_gpus))]
                ex.update_parameters(gpus_per_node=len(ids), visible_gpus=tuple(ids))
                run.gpus = ",".join(map(str, ids)) if ids else os.environ.get(
                    "CUDA_VISIBLE_DEVICES")  # GPUs named by UUID: every run sees all of them
                job = stop.submit(ex, run)
                running[job], held[job] = (cell, seed, d), ids
            if stop.asked and time.monotonic() - asked_at > RESEND_S:
                # Again and again: a job still starting may have missed it (the run hears it
                # once). submitit's controller passes it on to the job.
                asked_at = time.monotonic()
                for job in running:
                    if job._process is not None and job._process.poll() is None:
                        job._process.send_signal(signal.SIGTERM)
            if stop.asked and queue:
                counts["not started"] = counts.get("not started", 0) + len(queue)
                queue = []
            for job in [j for j in running if j.done()]:
                cell, seed, d = running.pop(job)
                free += held.pop(job)
                status, wall = job_result(job, d, stop.asked)
                counts[status] = counts.get(status, 0) + 1
                if status == "not started":
                    continue
                bar.write(f"  {status:9s} {cell.label} seed {seed} ({wall:.0f} s)  {d}")
                if status not in FINAL and status != "preempted":
                    bar.write(f"    see {d / 'train.log'}")
                bar.update(1)
            time.sleep(POLL_S)
    return counts


def torch_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def gpu_ids(n: int) -> list[int]:
    """The ids of this machine's `n` GPUs as CUDA_VISIBLE_DEVICES names them for a child (the
    sweep's own CUDA_VISIBLE_DEVICES, where set, maps them); [] where it names them by UUID,
    and then the runs share every GPU, as they would without the sweep."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(n))
    parts = [x.strip() for x in env.split(",") if x.strip()]
    return [int(x) for x in parts][:n] if all(x.isdigit() for x in parts) else []


def needs(cell: Cell, gpus: int) -> int:
    """GPUs one run of `cell` takes on a machine with `gpus`: one per rank (a simulated run
    is one process, one GPU), none on a machine without."""
    return cell.cfg["dist"]["nproc_per_node"] if gpus else 0


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
        ex = executor("slurm", folder, ranks=n, threads=threads, jobs=jobs, slurm=slurm)
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


def outcome(counts: dict[str, int], minutes: float) -> int:
    """Print how the sweep ended; its exit status: PREEMPTED when a signal stopped it (the
    same command resumes), 1 when a run failed, else 0."""
    if counts.get("submitted") or counts.get("on SLURM"):
        on = counts.get("on SLURM", 0)
        print(f"submitted {counts.get('submitted', 0)} run(s) to SLURM in {minutes:.1f} min"
              + (f"; {on} submitted earlier are still there" if on else "") + ": the same "
              "command without --no-wait follows them to the end (it submits none twice).")
        return 0
    print(("finished: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
           if counts else "nothing to run") + f" in {minutes:.1f} min")
    if counts.get("preempted") or counts.get("not started"):
        print("stopped by a signal: run the same command to resume the preempted runs from "
              "their checkpoints.")
        return PREEMPTED
    return 1 if any(s not in FINAL for s in counts) else 0


def add_launcher_args(p: argparse.ArgumentParser) -> None:
    """Where the runs go: this machine (default) or SLURM, with the job's resources."""
    g = p.add_argument_group("launcher (submitit)")
    g.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local: on this machine, --jobs at a time (default); slurm: one job "
                        "array, --jobs at a time")
    g.add_argument("--allow-dirty", action="store_true",
                   help="run from a working tree with uncommitted changes (a trial: such runs "
                        "are never committed; without it the sweep refuses)")
    g.add_argument("--partition", help="SLURM partition")
    g.add_argument("--nodes", type=int,
                   help="SLURM nodes per run of several ranks (default 1; a one-rank run, "
                        "simulated ones included, always takes one)")
    g.add_argument("--tasks-per-node", type=int,
                   help="SLURM tasks per node, one rank each (default: the run's "
                        "dist.nproc_per_node / --nodes)")
    g.add_argument("--gpus-per-node", type=int,
                   help="SLURM GPUs per node, one per rank (default 0: train on CPU)")
    g.add_argument("--cpus-per-task", type=int, help="SLURM CPUs per task (default 1)")
    g.add_argument("--time", type=int,
                   help=f"SLURM time limit, minutes (default {Slurm.time_min})")
    g.add_argument("--signal-delay", type=int,
                   help="seconds before the time limit that SLURM asks the run to checkpoint; "
                        f"the job is then requeued and resumes (default {Slurm.signal_delay_s})")
    g.add_argument("--account", help="SLURM account")
    g.add_argument("--qos", help="SLURM quality of service")
    g.add_argument("--constraint", help="SLURM node constraint")
    g.add_argument("--setup", action="append", default=[],
                   help="a shell line run before each SLURM job (repeatable), e.g. "
                        "'source .venv/bin/activate'")
    g.add_argument("--no-wait", action="store_true",
                   help="slurm: return once submitted (the same command later skips runs "
                        "still queued or running)")


SLURM_ONLY = ("partition", "nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "time",
              "signal_delay", "account", "qos", "constraint", "setup", "no_wait")


def launcher_kwargs(a: argparse.Namespace) -> dict:
    """sweep()'s launcher arguments from add_launcher_args' options."""
    if a.launcher == "local":
        given = [o for o in SLURM_ONLY if getattr(a, o) not in (None, False, [])]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise BnlabError(f"{flag} is a SLURM option; add --launcher slurm, or leave it out.")
        return {"launcher": "local", **dirty_kwargs(a)}
    for name in ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "time",
                 "signal_delay"):
        v, low = getattr(a, name), 0 if name == "gpus_per_node" else 1
        if v is not None and v < low:
            raise BnlabError(f"--{name.replace('_', '-')}={v} must be at least {low}.")
    base = Slurm()
    slurm = Slurm(partition=a.partition, nodes=a.nodes or base.nodes,
                  tasks_per_node=a.tasks_per_node, gpus_per_node=a.gpus_per_node or 0,
                  cpus_per_task=a.cpus_per_task, time_min=a.time or base.time_min,
                  signal_delay_s=a.signal_delay or base.signal_delay_s, account=a.account,
                  qos=a.qos, constraint=a.constraint, setup=list(a.setup))
    return {"launcher": "slurm", "slurm": slurm, "wait": not a.no_wait, **dirty_kwargs(a)}


def dirty_kwargs(a: argparse.Namespace) -> dict:
    """--allow-dirty, where given (else the default: BNLAB_ALLOW_DIRTY, or refuse)."""
    return {"allow_dirty": True} if a.allow_dirty else {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", type=Path, nargs="+", help="experiments/<name>/sweep.yaml ...")
    p.add_argument("--data", help="folder holding cifar-10-batches-py (no download)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="runs in parallel (default: one per core, one thread each)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state")
    p.add_argument("--runs", type=Path, default=RUNS,
                   help=f"folder of run directories (default {shown(RUNS)})")
    add_launcher_args(p)
    a = p.parse_args(argv)

    def body() -> int:
        if a.jobs < 1:
            raise BnlabError(f"--jobs={a.jobs} must be at least 1.")
        kw = launcher_kwargs(a)  # a wrong option fails before any spec is composed
        specs = [load_spec(s, a.data, here=kw["launcher"] == "local") for s in a.specs]
        if a.dry_run:
            tag = data_tag(specs[0].cells[0].cfg)
            for cell, seed, d in plan(specs, tag, a.runs):
                print(f"{read_status(d) or 'to run':10s} {cell.label:42s} seed {seed}  "
                      f"{shown(d)}")
            return 0
        t0 = time.perf_counter()
        counts = sweep(specs, a.data, a.jobs, root=a.runs, **kw)
        return outcome(counts, (time.perf_counter() - t0) / 60)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
