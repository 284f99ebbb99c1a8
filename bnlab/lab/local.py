"""A sweep's runs on this machine: submitit's local jobs, `jobs` at a time, each rank of a run
on a GPU that at most `runs_per_gpu` runs share (default 1: GPUs of its own), while enough
are free.

SIGTERM or Ctrl-C, or the time limit (`stop_after`), stops the sweep cleanly: nothing new
starts, and each running job is asked (again and again) to checkpoint and stop as
`preempted`. The gentler limit (`drain_after`) only stops new runs from starting: the running
ones finish, so a machine that will not keep their checkpoints loses nothing.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tqdm import tqdm

from bnlab.errors import BnlabError
from bnlab.lab.jobs import NOT_STARTED, POLL_S, Stop, TrainJob, job_result
from bnlab.lab.plan import Cell
from bnlab.rundir import FINAL

LOCAL_TIMEOUT_MIN = 60 * 24 * 30  # no time limit on this machine (submitit's default is 2 min)
RESEND_S = 5.0  # while a sweep stops, each running job is asked again this often
DRAW_S = 5.0  # the bar is redrawn at most this often while only the epochs move
BAR = ("{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.0f} epochs "  # progress by epochs
       "[{elapsed}<{remaining}{postfix}]")


def executor(folder: Path):
    """submitit's executor for jobs on this machine; its logs and pickles go to `folder`
    (`%j` is the job id)."""
    import submitit

    ex = submitit.LocalExecutor(folder=str(folder))
    ex.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN, tasks_per_node=1)
    return ex


def run_local(todo: list[tuple[Cell, int, Path]], runs: list[TrainJob], folder: Path,
              jobs: int, gpus: int | None, name: str, stop_after: float | None = None,
              runs_per_gpu: int = 1, drain_after: float | None = None) -> dict[str, int]:
    """Run the runs here, `jobs` at a time, until they end or a signal stops them (submitit's
    logs under `folder`); returns how many ended how. Each rank of a run gets a GPU (`gpus`,
    default every visible one) that at most `runs_per_gpu` runs share, and a run waits while
    too few are free. After `stop_after` minutes the sweep stops as if SIGTERM had come; after
    `drain_after` minutes no run starts, and the running ones go on to their end."""
    counts: dict[str, int] = {}
    queue = list(zip(todo, runs, strict=True))
    running: dict = {}
    ex = executor(folder)
    free, held = gpu_slots([c for c, _, _ in todo], gpus, runs_per_gpu, jobs), {}  # job ->
    n_gpus = len(set(free))
    epochs = {d: float(c.cfg["epochs"]) for c, _, d in todo}  # the bar counts epochs trained
    ended: dict[Path, float] = {}  # runs that ended -> the epochs they trained, read once
    last, drawn = (0.0, 0, 0), 0.0  # what the bar shows, and when it was drawn
    planned = len(todo)  # the runs this sweep will start (fewer after a drain)
    limit = None if stop_after is None else time.monotonic() + 60 * stop_after
    drain = None if drain_after is None else time.monotonic() + 60 * drain_after
    with Stop() as stop, tqdm(total=sum(epochs.values()), desc=name, unit="epoch",
                              dynamic_ncols=True, bar_format=BAR) as bar:
        asked_at = 0.0  # when the running jobs were last asked to stop
        while queue or running:
            stop_at_limit(stop, limit, stop_after, bar)
            if queue and drain is not None and time.monotonic() >= drain:
                left = (f"the {len(running)} running go on to their end" if running else
                        "none is running")
                bar.write(f"  --drain-after {drain_after:g} min reached: {len(queue)} run(s) "
                          f"not started, {left}; the same command runs the rest")
                counts[NOT_STARTED] = counts.get(NOT_STARTED, 0) + len(queue)
                bar.total -= sum(epochs[d] for (_, _, d), _ in queue)  # they will not train
                planned -= len(queue)
                queue = []
            while queue and len(running) < jobs and not stop.asked and \
                    (ids := take(free, needs(queue[0][0][0], n_gpus))) is not None:
                (cell, seed, d), run = queue.pop(0)
                ex.update_parameters(gpus_per_node=len(ids), visible_gpus=tuple(ids))
                run.gpus = ",".join(map(str, ids)) if ids else os.environ.get(
                    "CUDA_VISIBLE_DEVICES")  # GPUs named by UUID: every run sees all of them
                job = stop.submit(ex, run)
                running[job], held[job] = (cell, seed, d), ids
                bar.initial += min(epoch_reached(d), epochs[d])  # a resumed run's earlier
                # epochs: counted as done, not in the rate the time left is estimated from
            if stop.asked and time.monotonic() - asked_at > RESEND_S:
                # Again and again: a job still starting may have missed it (the run hears it
                # once). submitit's controller passes it on to the job.
                asked_at = time.monotonic()
                for job in running:
                    if job._process is not None and job._process.poll() is None:
                        job._process.send_signal(signal.SIGTERM)
            if stop.asked and queue:
                counts[NOT_STARTED] = counts.get(NOT_STARTED, 0) + len(queue)
                queue = []
            for job in [j for j in running if j.done()]:
                cell, seed, d = running.pop(job)
                free += held.pop(job)
                status, wall = job_result(job, d, stop.asked)
                counts[status] = counts.get(status, 0) + 1
                if status == NOT_STARTED:
                    continue
                bar.write(f"  {status:9s} {cell.label} seed {seed} ({wall:.0f} s)  {d}")
                if status not in FINAL and status != "preempted":
                    bar.write(f"    see {d / 'train.log'}")
                ended[d] = epochs[d] if status in FINAL else min(epoch_reached(d), epochs[d])
            done = sum(ended.values()) + sum(min(epoch_reached(d), epochs[d])
                                             for _, _, d in running.values())
            shown = (round(done, 1), len(ended), len(running))
            if shown != last and (shown[1:] != last[1:] or time.monotonic() - drawn > DRAW_S):
                advance(bar, shown[0])  # redrawn when it moved, at most every DRAW_S
                bar.set_postfix_str(f"runs {len(ended)}/{planned} ended, {len(running)} "
                                    "running", refresh=False)
                bar.refresh()
                last, drawn = shown, time.monotonic()
            time.sleep(POLL_S)
    return counts


def gpu_slots(cells: list[Cell], gpus: int | None, runs_per_gpu: int, jobs: int) -> list[int]:
    """The GPUs the runs of `cells` get here (`gpus`, default every visible one), each listed
    once per run it can take at a time (`runs_per_gpu`); one sentence where a run needs more
    GPUs than there are, or where there are none to pack runs onto."""
    ids = gpu_ids(torch_gpus() if gpus is None else gpus)
    if any(needs(c, len(ids)) > len(ids) for c in cells):
        raise BnlabError(f"a run needs more GPUs than the {len(ids)} visible here; run it on a "
                         "machine with more, or with --launcher slurm.")
    if runs_per_gpu > 1 and not ids:
        raise BnlabError(f"--runs-per-gpu={runs_per_gpu} needs GPUs this sweep can hand out, "
                         "and none is visible here (or CUDA_VISIBLE_DEVICES names them by UUID); "
                         "leave it out, or name the GPUs by number.")
    slots = ids * runs_per_gpu
    if runs_per_gpu > 1 and jobs < len(slots):
        print(f"note: --jobs {jobs} runs at a time leave {len(slots) - jobs} of the "
              f"{len(slots)} GPU slots idle; --jobs {len(slots)} fills them")
    return slots


def stop_at_limit(stop: Stop, limit: float | None, minutes: float | None, bar) -> None:
    """Past the time limit (`limit`, on time.monotonic's clock), stop as SIGTERM does, once."""
    if limit is not None and time.monotonic() >= limit and not stop.asked:
        stop.signum = signal.SIGTERM
        bar.write(f"  --stop-after {minutes:g} min reached: each running run checkpoints and "
                  "stops; the same command resumes")


def advance(bar: tqdm, done: float) -> None:
    """Show `done` epochs, never fewer than the resumed runs had when they started: a resuming
    run's log steps back to its checkpoint, which gave tqdm a negative rate and time left."""
    bar.n = max(done, bar.initial)


def epoch_reached(d: Path) -> float:
    """How far a running run has trained, in epochs: the `epoch` of the last line of its
    metrics.jsonl (read from the file's end), 0 before its first."""
    f = d / "metrics.jsonl"
    try:
        with open(f, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            tail = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return 0.0
    for line in reversed(tail):
        try:
            return float(json.loads(line)["epoch"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0.0


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


def take(free: list[int], n: int) -> list[int] | None:
    """`n` different GPUs for one run, out of `free` (a GPU appears there once per run it can
    still take), the least loaded first, removed from `free`; None, `free` untouched, where
    fewer than `n` GPUs have room."""
    ids = sorted(set(free), key=lambda g: (-free.count(g), g))[:n]
    if len(ids) < n:
        return None
    for g in ids:
        free.remove(g)
    return ids


def needs(cell: Cell, gpus: int) -> int:
    """GPUs one run of `cell` takes on a machine with `gpus`: one per rank (a simulated run
    is one process, one GPU), none on a machine without."""
    return cell.cfg["dist"]["nproc_per_node"] if gpus else 0
