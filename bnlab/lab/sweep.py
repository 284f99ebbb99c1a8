"""Run an experiment's grid (cells x seeds) as separate `train.py` runs, N at a time.

    python -m bnlab.lab.sweep experiments/jitter/sweep.yaml --data ../shared/data/cifar10-mini

(`make table-<name>` runs its table's sweep through `python -m bnlab.claims <name>`.)

A sweep spec (`experiments/<name>/sweep.yaml`) names a Hydra experiment config, the seeds,
and its cells (a label and the overrides that make the cell). Each cell is composed first,
so a typo fails before anything runs. A run's directory is named by a hash of its resolved
config (keys that cannot change the result left out), under `experiments/runs/<data tag>/`:
tables that share a cell share its runs, and a run that has finished (completed or
diverged) is never run again, so an interrupted sweep picks up where it stopped.

SIGTERM or Ctrl-C stops the sweep cleanly: each running job checkpoints and stops as
`preempted`, and the same command later resumes those runs from their checkpoints (a run
left unfinished without a checkpoint is set aside and run again).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tqdm import tqdm

from bnlab.checkpoint import CHECKPOINT
from bnlab.cli import run_cli
from bnlab.config import NOT_EXPERIMENT, without, without_added_later
from bnlab.errors import BnlabError
from bnlab.paths import CONFIGS, ROOT, RUNS, shown
from bnlab.rundir import machine, read_status

FINAL = ("completed", "diverged")  # a run with this status is a result: never re-run
RUN_ONLY = ["progress=false", "checkpoint=true", "resume=auto"]
PREEMPTED = 75  # the sweep's exit status when stopped by a signal (as train.py's)


class Jobs:
    """The live train.py processes, so a signal can stop them all and nothing new starts."""

    def __init__(self, n: int = 1):
        self.n = n  # runs side by side
        self.lock, self.procs, self.stopping = threading.Lock(), set(), False

    def start(self, cmd: list[str], **kw) -> subprocess.Popen | None:
        with self.lock:
            if self.stopping:
                return None
            proc = subprocess.Popen(cmd, **kw)
            self.procs.add(proc)
            return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self.lock:
            self.procs.discard(proc)

    def stop(self, *_) -> None:
        """Each running job checkpoints and stops (train.py handles SIGTERM at a step)."""
        with self.lock:
            self.stopping = True
            for proc in self.procs:
                proc.send_signal(signal.SIGTERM)


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


def compose(overrides: list[str]) -> dict:
    """The resolved training config for these overrides, as train.py would build it."""
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
    validate(cfg)
    return cfg


def data_overrides(data: str | None) -> list[str]:
    """`--data DIR` reads CIFAR-10 from DIR and never downloads; without it, the default."""
    return [f"data.root={Path(data).resolve()}", "data.download=false"] if data else []


def load_spec(path: Path, data: str | None = None) -> Spec:
    path = Path(path)
    if not path.is_file():
        raise BnlabError(f"no sweep spec at {path}; give experiments/<name>/sweep.yaml.")
    return spec_from(yaml.safe_load(path.read_text()), path, data)


def spec_from(raw: dict, path: Path, data: str | None = None, name: str | None = None) -> Spec:
    """A spec from its parsed YAML; its name is `name`, else the folder of `path`."""
    exp, seeds = raw["experiment"], raw.get("seeds", [0, 1, 2])
    cells = []
    for c in raw["cells"]:
        ov = [f"experiment={exp}", *c.get("overrides", [])]
        meta = {k: v for k, v in c.items() if k not in ("label", "overrides", "seeds")}
        cell = Cell(c["label"], ov, c.get("seeds", seeds), meta=meta)
        cell.cfg = compose(ov + data_overrides(data))
        cells.append(cell)
    extra = {k: v for k, v in raw.items() if k not in ("title", "experiment", "seeds", "cells")}
    name = name or path.parent.name
    return Spec(name, raw.get("title", name), exp, cells, path, extra)


def data_tag(cfg: dict) -> str:
    """Which data the runs saw: `cifar10-<training images>` (or `synthetic-<n>`)."""
    from bnlab.config import check_data
    from bnlab.data import build_dataset

    check_data(cfg)
    d = build_dataset(cfg["data"])
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


def launch(cell: Cell, seed: int, d: Path, data: str | None, threads: int,
           extra: list[str], jobs: Jobs) -> tuple[str, float]:
    """One train.py run in its own process (resuming the run in `d` if it has a checkpoint);
    returns (status, wall seconds of this launch). sweep.json sums the wall time of all
    launches of the run."""
    if jobs.stopping:  # the sweep is stopping: this run never starts
        return "not started", 0.0
    d.mkdir(parents=True, exist_ok=True)
    before = json.loads((d / "sweep.json").read_text()) if (d / "sweep.json").is_file() else {}
    cmd = [sys.executable, str(ROOT / "train.py"), *cell.overrides, *data_overrides(data),
           f"seed={seed}", f"hydra.run.dir={d}", f"dist.threads={threads}", *RUN_ONLY, *extra]
    t0 = time.perf_counter()
    with open(d / "train.log", "a" if before else "w") as log:
        kw = dict(cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        proc = jobs.start(cmd, **kw)
        if proc is None:
            return "not started", 0.0
        rc = proc.wait()
        jobs.done(proc)
    wall = time.perf_counter() - t0
    if rc == -signal.SIGTERM and jobs.stopping and read_status(d) is None and not before:
        # The sweep's own SIGTERM came before train.py could handle it: the run never began.
        shutil.rmtree(d)
        return "not started", 0.0
    status = read_status(d) or "failed"
    if rc != 0 and status == "running":
        status = "failed"
    rec = {"cell": cell.label, "seed": seed, "rc": rc,
           "wall_s": round(before.get("wall_s", 0.0) + wall, 1), "threads": threads,
           "jobs": jobs.n,
           "launches": before.get("launches", 1 if before else 0) + 1}
    (d / "sweep.json").write_text(json.dumps(rec) + "\n")
    return status, wall


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


def sweep(specs: list[Spec], data: str | None, jobs: int, extra: list[str] | None = None,
          root: Path = RUNS) -> dict[str, int]:
    tag = data_tag(specs[0].cells[0].cfg)
    name = "+".join(s.name for s in specs)
    todo = []
    for cell, seed, d in plan(specs, tag, root):
        status = read_status(d)
        if status in FINAL:
            continue
        if d.exists() and not resumable(d):
            print(f"set aside unfinished run: {set_aside(d)}")
        elif d.exists():
            print(f"will resume {status or 'unfinished'} run: {d}")
        todo.append((cell, seed, d))
    if todo:
        record_host(root / tag)
    total = len(plan(specs, tag, root))
    print(f"{name}: {total - len(todo)} of {total} runs already done under "
          f"{root / tag}; running {len(todo)} with {jobs} job(s) in parallel")
    threads = max(1, (os.cpu_count() or 1) // jobs)
    counts: dict[str, int] = {}
    running = Jobs(jobs)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, running.stop) for sig in (signal.SIGTERM,
                                                                      signal.SIGINT)}
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool, \
                tqdm(total=len(todo), desc=name, unit="run", dynamic_ncols=True) as bar:
            futs = {pool.submit(launch, c, s, d, data, threads, extra or [], running): (c, s, d)
                    for c, s, d in todo}
            for f in as_completed(futs):
                cell, seed, d = futs[f]
                status, wall = f.result()
                counts[status] = counts.get(status, 0) + 1
                if status == "not started":
                    continue
                bar.write(f"  {status:9s} {cell.label} seed {seed} ({wall:.0f} s)  {d}")
                if status not in FINAL and status != "preempted":
                    bar.write(f"    see {d / 'train.log'}")
                bar.update(1)
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
    return counts


def outcome(counts: dict[str, int], minutes: float) -> int:
    """Print how the sweep ended; its exit status: PREEMPTED when a signal stopped it (the
    same command resumes), 1 when a run failed, else 0."""
    print(("finished: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
           if counts else "nothing to run") + f" in {minutes:.1f} min")
    if counts.get("preempted") or counts.get("not started"):
        print("stopped by a signal: run the same command to resume the preempted runs from "
              "their checkpoints.")
        return PREEMPTED
    return 1 if any(s not in FINAL for s in counts) else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("specs", type=Path, nargs="+", help="experiments/<name>/sweep.yaml ...")
    p.add_argument("--data", help="folder holding cifar-10-batches-py (no download)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="runs in parallel (default: one per core, one thread each)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state")
    p.add_argument("--runs", type=Path, default=RUNS,
                   help=f"folder of run directories (default {shown(RUNS)})")
    a = p.parse_args(argv)

    def body() -> int:
        if a.jobs < 1:
            raise BnlabError(f"--jobs={a.jobs} must be at least 1.")
        specs = [load_spec(s, a.data) for s in a.specs]
        if a.dry_run:
            tag = data_tag(specs[0].cells[0].cfg)
            for cell, seed, d in plan(specs, tag, a.runs):
                print(f"{read_status(d) or 'to run':10s} {cell.label:42s} seed {seed}  "
                      f"{shown(d)}")
            return 0
        t0 = time.perf_counter()
        counts = sweep(specs, a.data, a.jobs, root=a.runs)
        return outcome(counts, (time.perf_counter() - t0) / 60)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
