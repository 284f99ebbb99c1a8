"""Run an experiment's grid (cells x seeds) as separate `train.py` runs, N at a time, as
submitit jobs: on this machine (the default) or on a SLURM cluster.

    python -m bnlab.lab.sweep experiments/jitter/sweep.yaml --data ../shared/data/cifar10-mini
    python -m bnlab.lab.sweep experiments/jitter/sweep.yaml --launcher slurm --partition gpu \\
        --gpus-per-node 1 --time 240 --jobs 16

(`make table-<name>` runs its table's sweep through `python -m bnlab.claims <name>`.)

The specs are composed (`bnlab/lab/spec.py`) and their runs planned (`bnlab/lab/plan.py`)
first: a typo fails before anything runs, and a run that has finished (completed or
diverged) is never run again, so an interrupted sweep picks up where it stopped. The runs
left go to this machine (`bnlab/lab/local.py`) or to SLURM (`bnlab/lab/slurm.py`), each as a
submitit job (`bnlab/lab/jobs.py`).

SIGTERM or Ctrl-C stops the sweep cleanly: each running job checkpoints and stops as
`preempted`, and the same command later resumes those runs from their checkpoints (a run
left unfinished without a checkpoint is set aside and run again). On SLURM, a job warned of
its time limit or preempted (SIGUSR2, `--signal-delay` seconds ahead) checkpoints its run and
is requeued, and resumes it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bnlab.cli import EXIT_PREEMPTED, run_cli
from bnlab.errors import BnlabError
from bnlab.lab.jobs import NOT_STARTED, TrainJob, resumable
from bnlab.lab.local import run_local
from bnlab.lab.plan import Cell, Spec, plan, set_aside
from bnlab.lab.results import read_hosts
from bnlab.lab.spec import data_overrides, data_tag, load_spec
from bnlab.paths import ROOT, RUNS, shown
from bnlab.rundir import FINAL, git_commit, machine, read_status

if TYPE_CHECKING:  # imported where a SLURM sweep or the launcher options need it: a table
    # or the runs read back never import SLURM's code
    from bnlab.lab.slurm import Slurm

LAUNCHERS = ("local", "slurm")
RUN_ONLY = ["progress=false", "checkpoint=true", "resume=auto"]
SUBMITIT = ".submitit"  # submitit's folder of job pickles and logs, under runs/<tag>/
ALLOW_DIRTY = "BNLAB_ALLOW_DIRTY"  # set (or --allow-dirty): runs from uncommitted code allowed


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


def train_job(cell: Cell, seed: int, d: Path, data: str | None, threads: int, jobs: int,
              extra: list[str]) -> TrainJob:
    """The `train.py` command of one run (resuming the run in `d` if it has a checkpoint)."""
    cmd = [sys.executable, str(ROOT / "train.py"), *cell.overrides, *data_overrides(data),
           f"seed={seed}", f"hydra.run.dir={d}", f"dist.threads={threads}", *RUN_ONLY, *extra]
    return TrainJob(cmd, str(d), str(ROOT), cell.label, seed, threads, jobs)


def per_process(threads: int, cell: Cell) -> int:
    """A run's threads for each of its processes: a real-DDP cell's `dist.nproc_per_node`
    processes share the run's `threads` (at 2 threads each, 4 processes oversubscribe 2
    cores 4-fold)."""
    return max(1, threads // max(1, cell.cfg["dist"].get("nproc_per_node", 1)))


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
          allow_dirty: bool | None = None, stop_after: float | None = None,
          runs_per_gpu: int = 1, drain_after: float | None = None) -> dict[str, int]:
    """Run every unfinished run of `specs` through submitit, `jobs` at a time; returns how
    many ended how. On this machine each rank of a run gets a GPU (`gpus`, default every
    visible one) that at most `runs_per_gpu` runs share, and a run waits while too few are
    free. `launcher="slurm"`
    submits them as one SLURM job array instead (with `slurm`'s resources; `wait=False`
    returns once they are submitted). Runs start only from a clean working tree unless
    `allow_dirty` (or BNLAB_ALLOW_DIRTY) says otherwise. On this machine, `stop_after`
    minutes stop the sweep as SIGTERM does, and after `drain_after` minutes no run starts
    (the running ones finish)."""
    tag = data_tag(specs[0].cells[0].cfg)
    name = "+".join(s.name for s in specs)
    if launcher == "slurm":  # every run's layout, before anything is moved or submitted
        from bnlab.lab.slurm import Slurm, slurm_states, submit_slurm

        slurm = slurm or Slurm()
        for n in sorted({c.cfg["dist"]["nproc_per_node"] for s in specs for c in s.cells}):
            slurm.layout(n)
    planned = [(c, s, d, read_status(d)) for c, s, d in plan(specs, tag, root)]
    states = slurm_states([d for *_, d, status in planned if status not in FINAL]) \
        if launcher == "slurm" else {}
    todo, on_slurm = unfinished(planned, states)
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
        slurm.cpus_per_task or 1
    runs = [train_job(c, s, d, data, per_process(threads, c), jobs, extra or [])
            for c, s, d in todo]
    if launcher == "slurm":
        return submit_slurm(todo, runs, submit_folder(root, tag), jobs, threads, slurm, wait,
                            on_slurm)
    return run_local(todo, runs, submit_folder(root, tag), jobs, gpus, name, stop_after,
                     runs_per_gpu, drain_after)


def unfinished(planned: list, states: dict[Path, str]) -> tuple[list, list]:
    """The planned runs (cell, seed, dir, status) to run now, and those still on SLURM
    (`states`: submitted before and still there, followed, never submitted twice). A run
    left unfinished without a checkpoint is set aside first; one with a checkpoint resumes."""
    todo, on_slurm = [], []
    for cell, seed, d, status in planned:
        if status in FINAL:
            continue
        if d in states:
            print(f"still {states[d]} on SLURM, not submitted again: {d}")
            on_slurm.append((cell, seed, d))
            continue
        if d.exists() and not resumable(d):
            print(f"set aside unfinished run: {set_aside(d)}")
        elif d.exists():
            print(f"will resume {status or 'unfinished'} run: {d}")
        todo.append((cell, seed, d))
    return todo, on_slurm


def outcome(counts: dict[str, int], minutes: float) -> int:
    """Print how the sweep ended; its exit status: EXIT_PREEMPTED when a signal or its time
    limit stopped it (the same command resumes), 1 when a run failed, else 0."""
    if counts.get("submitted") or counts.get("on SLURM"):
        on = counts.get("on SLURM", 0)
        print(f"submitted {counts.get('submitted', 0)} run(s) to SLURM in {minutes:.1f} min"
              + (f"; {on} submitted earlier are still there" if on else "") + ": the same "
              "command without --no-wait follows them to the end (it submits none twice).")
        return 0
    print(("finished: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
           if counts else "nothing to run") + f" in {minutes:.1f} min")
    if counts.get("preempted") or counts.get(NOT_STARTED):
        print("stopped (a signal, --stop-after or --drain-after): run the same command to run "
              "the rest (preempted runs resume from their checkpoints).")
        return EXIT_PREEMPTED
    return 1 if any(s not in FINAL for s in counts) else 0


def add_launcher_args(p: argparse.ArgumentParser) -> None:
    """Where the runs go: this machine (default) or SLURM, with the job's resources."""
    from bnlab.lab.slurm import Slurm  # the defaults it shows

    g = p.add_argument_group("launcher (submitit)")
    g.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local: on this machine, --jobs at a time (default); slurm: one job "
                        "array, --jobs at a time")
    g.add_argument("--stop-after", type=float, metavar="MIN",
                   help="local: after MIN minutes stop as SIGTERM does (running runs checkpoint "
                        "and stop as preempted, queued ones wait); the same command resumes, "
                        "here or on another machine (default: no limit; on SLURM: --time)")
    g.add_argument("--drain-after", type=float, metavar="MIN",
                   help="local: after MIN minutes start no new run; the running ones go on "
                        "to their end however long they take (for a machine that will not keep "
                        "their checkpoints: MIN = the slot less the longest run, or add "
                        "--stop-after as the hard limit); exit 75 if runs were left, and the "
                        "same command later runs them (default: no limit)")
    g.add_argument("--runs-per-gpu", type=int, metavar="K",
                   help="local: up to K runs share each GPU, each its own process with a share "
                        "of the CPU threads (set --jobs to K x GPUs; default 1)")
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
        for flag, v in (("--stop-after", a.stop_after), ("--drain-after", a.drain_after)):
            if v is not None and not v > 0:
                raise BnlabError(f"{flag}={v:g} must be a positive number of minutes.")
        if a.runs_per_gpu is not None and a.runs_per_gpu < 1:
            raise BnlabError(f"--runs-per-gpu={a.runs_per_gpu} must be at least 1.")
        limit = {k: getattr(a, k) for k in ("stop_after", "drain_after")
                 if getattr(a, k) is not None}
        pack = {} if a.runs_per_gpu is None else {"runs_per_gpu": a.runs_per_gpu}
        return {"launcher": "local", **limit, **pack, **dirty_kwargs(a)}
    if a.stop_after is not None or a.drain_after is not None:
        flag = "--stop-after" if a.stop_after is not None else "--drain-after"
        raise BnlabError(f"{flag} is for sweeps on this machine; on SLURM, --time sets the "
                         "limit (runs checkpoint before it and are requeued).")
    if a.runs_per_gpu is not None:
        raise BnlabError("--runs-per-gpu is for sweeps on this machine; on SLURM each run is "
                         "its own job with the GPUs it asks for (--gpus-per-node).")
    for name in ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "time",
                 "signal_delay"):
        v, low = getattr(a, name), 0 if name == "gpus_per_node" else 1
        if v is not None and v < low:
            raise BnlabError(f"--{name.replace('_', '-')}={v} must be at least {low}.")
    from bnlab.lab.slurm import Slurm

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
    p = argparse.ArgumentParser(prog="python -m bnlab.lab.sweep",
                                description=__doc__.split("\n\n")[0].replace("\n", " "))
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
