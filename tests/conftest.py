"""Shared test helpers: the real CIFAR-10 subset, and running the real entry points."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Tests sweep into temporary folders, from whatever tree they run in (a developer's is often
# dirty); test_sweep.py checks the refusal with this unset.
os.environ.setdefault("BNLAB_ALLOW_DIRTY", "1")
# bnlab.lab.spec's cache of composed configs is kept for this test session only, in a folder
# of its temporary directory (pytest_configure below), never in the user's ~/.cache: the
# committed sweeps' cells are composed by the sweep tests' collection in every worker, by
# `make report`'s rebuild and by the claims' tests, and each composition after the first is
# read back. Nothing is kept before that folder is known; test_spec.py tests the cache itself.
# A BNLAB_CACHE set by the caller is left as it is.
SESSION_CACHE = "BNLAB_CACHE" not in os.environ
os.environ.setdefault("BNLAB_CACHE", "off")
# One torch thread in this process and in the ones the tests start (set before torch is
# imported): the tests' models and batches are tiny, and on a 2-core machine shared with
# anything else, two OpenMP threads per process wait on each other at every op (a
# mobilenet_v3_small step took 4.5 s with two threads under load, 0.15 s with one). Runs
# trained by tests take dist.threads=1 for the same reason (SMOKE, dist.init(..., 1)).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Bytecode: the tests start dozens of Python processes (gloo ranks, torchrun, train.py, sweep
# jobs), each importing torch and the rest again. Where PYTHONDONTWRITEBYTECODE is set (as on
# this project's machines) and the venv holds no .pyc, each of them compiled a thousand modules
# from source: 5 s of CPU a process under load (10 s to import torch, torchvision, hydra and
# bnlab instead of 5). `make install` compiles the venv's bytecode (uv sync --compile-bytecode),
# which every process reads; where it was installed otherwise, the tests' processes keep their
# bytecode outside the tree instead, in one folder under the temporary directory (Python then
# reads bytecode from that folder only, so this is not done where the venv has its own).


def _venv_has_bytecode() -> bool:
    import importlib.util

    spec = importlib.util.find_spec("torch")  # found, not imported
    return bool(spec and spec.origin and Path(importlib.util.cache_from_source(spec.origin))
                .is_file())


if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX") \
        and not _venv_has_bytecode():
    import tempfile

    _prefix = str(Path(tempfile.gettempdir()) / "bnlab-test-pycache")
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = _prefix
    sys.dont_write_bytecode = False
CIFAR_MINI = Path(os.environ.get("BNLAB_TEST_DATA", ROOT.parent / "shared/data/cifar10-mini"))


def _fork_local_ranks() -> None:
    """The gloo ranks the tests start in-process (bnlab.dist.launch_local) come from a fork
    server, not each a fresh interpreter: one process per test worker that imported torch and
    bnlab once and forks each rank (0.7-0.8 s against 14 s for two ranks of an all_reduce,
    measured side by side beside a sweep; its first launch 7 s). Not a plain fork of the test
    worker: pytest-xdist's worker runs threads of its own, and a rank forked from it hung at
    joining its process group (3 tests errored after 300 s, in two of four runs). The server
    starts at the first launch of a test worker and its ranks see the environment of that
    moment, not of the launch that made them (torch's launcher adds only its own: RANK,
    MASTER_ADDR and the like). Runs the tests start as processes of their own (train.py
    through run_entry, torchrun, a sweep's jobs) spawn their ranks as a user's would; train.py
    run in-process (run_here) does not."""
    import multiprocessing

    from bnlab import dist

    multiprocessing.set_forkserver_preload(["torch", "bnlab.dist"])
    dist.START_METHOD = "forkserver"


_fork_local_ranks()


def _compose_once() -> None:
    """hydra.compose, each (config folder, name, overrides) composed once per test session and
    handed out as a copy. The committed sweeps' cells (well over a hundred) are composed by the
    sweep tests, by `make report`'s rebuild and by the claims' tests, each a Hydra compose of
    a fraction of a second; the result depends on nothing but the arguments and configs/,
    which no test changes. Only what composed is kept: an override that fails is tried again
    each time; interpolations (${oc.env:...}) are still resolved by each caller. Under
    pytest-xdist the workers also share what they composed, pickled into one folder of the
    session's temporary directory (`SHARED`), so a config one worker composed the others read."""
    import copy
    import hashlib
    import pickle

    import hydra
    from hydra.core.global_hydra import GlobalHydra

    real, done = hydra.compose, {}

    def compose(config_name=None, overrides=None, return_hydra_config=False, strict=None):
        path = str(GlobalHydra.instance().hydra.config_loader.config_search_path)
        key = (path, config_name, tuple(overrides or ()), return_hydra_config, strict)
        if key not in done:
            f = SHARED[0] / f"{hashlib.sha1(repr(key).encode()).hexdigest()}.pkl" if SHARED \
                else None
            if f is not None and f.is_file():
                done[key] = pickle.loads(f.read_bytes())
            else:
                done[key] = real(config_name, overrides, return_hydra_config, strict)
                if f is not None:  # bnlab's cache writer: a reader never sees half
                    from bnlab.lab.spec import keep

                    keep(f, pickle.dumps(done[key]))
        return copy.deepcopy(done[key])

    hydra.compose = compose


SHARED: list[Path] = []  # under pytest-xdist: the folder the workers' compositions go to


def _resolve_once() -> None:
    """bnlab.lab.spec.resolve, each composition resolved once per test process and handed out
    as a copy: resolving through OmegaConf is most of the time of a composition read back from
    the cache (25 ms against 3 ms), and the tests compose the committed cells hundreds of times
    in each worker. A resolved config depends on the composition and on the environment
    variables its `${oc.env:...}` read, which are the key; a composition with any other
    resolver (bnlab's `${run_stamp:}`, say) is resolved each time, as is one that fails."""
    import copy
    import re

    from bnlab.lab import spec

    real, done = spec.resolve, {}

    def resolve(cfg: dict) -> dict:
        text = repr(cfg)  # plain containers: the whole composition
        if not set(re.findall(r"\$\{([\w.]*):", text)) <= {"oc.env"}:
            return real(cfg)
        key = (text, tuple((v, os.environ.get(v)) for v in
                           sorted(set(re.findall(r"\$\{oc\.env:([^,}]+)", text)))))
        if key not in done:
            done[key] = real(cfg)
        return copy.deepcopy(done[key])

    spec.resolve = resolve


_resolve_once()


def pytest_configure(config):
    basetemp = getattr(config, "workerinput", None) and config.option.basetemp
    if basetemp:  # an xdist worker's, inside the session's: share the session's
        SHARED.append(Path(basetemp).parent / "composed")
    if SESSION_CACHE:  # the workers' shared folder, else one of this process's own
        folder = Path(basetemp).parent if basetemp else Path(tempfile.mkdtemp(prefix="bnlab-"))
        os.environ["BNLAB_CACHE"] = str(folder)  # the cache is its `composed` subfolder
        if not basetemp:
            config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


_compose_once()


# The modules whose tests take longest (each 15 to 35 s of a fresh clone's CI run), first.
# pytest-xdist's worksteal gives each worker half of the collection in order, then a worker
# that runs out takes half of what the other still has queued, from its end: with the long
# tests first, what is left to share at the end is short tests, and neither worker waits long
# for the other's last test. Each module's tests stay together and in their order, so module
# fixtures are built as often as before.
FIRST = ("test_resume.py", "claims/test_registry.py", "test_simulate.py", "lab/test_table.py",
         "test_verify.py", "test_train.py")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    rank = {here / m: i for i, m in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path, len(FIRST)))  # stable: the rest in order

needs_cifar = pytest.mark.skipif(
    not (CIFAR_MINI / "cifar-10-batches-py").is_dir(),
    reason=f"cifar10-mini not found at {CIFAR_MINI} (set BNLAB_TEST_DATA)",
)

# A few optimizer steps on real data: small enough for CI, real enough to exercise everything.
SMOKE = ["model=resnet20", "data=cifar10", f"data.root={CIFAR_MINI}", "data.download=false",
         "data.train_limit=256", "data.val_limit=128", "epochs=1", "batch_per_gpu=8",
         "eval_every=2", "log_every=2", "progress=false", "dist.threads=1"]


def run_entry(script: str, *args: str, cwd: Path, launcher: list[str] | None = None,
              env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run train.py / evaluate.py as a user would, from `cwd`, and capture the output."""
    cmd = (launcher or [sys.executable]) + [str(ROOT / script), *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    for k in ["BNLAB_RUN_STAMP"] + [k for k, v in (env or {}).items() if v is None]:
        full_env.pop(k, None)
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


_ENTRIES: dict = {}


def _entry(script: str):
    """train.py or evaluate.py as a module, loaded once: its Hydra main and its precheck."""
    import importlib.util

    if script not in _ENTRIES:
        spec = importlib.util.spec_from_file_location(f"_entry_{Path(script).stem}", ROOT / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        task = module.main
        while hasattr(task, "__wrapped__"):
            task = task.__wrapped__
        task.__module__ = "__main__"  # Hydra then finds configs/ beside the script, as run
        _ENTRIES[script] = module
    return _ENTRIES[script]


def run_here(script: str, *args: str, cwd: Path, env: dict | None = None
             ) -> subprocess.CompletedProcess:
    """`python <script> args` (train.py, evaluate.py, bnlab/lab/sweep.py) run inside this
    process, for tests where a new interpreter is not the point: the same checks, main and
    exit status, output captured, without starting Python and importing torch again (seconds
    per call). The working folder, environment, argv, torch's thread count and the signal
    handlers are given back afterwards. Each call gets its own run stamp, as a new
    interpreter would, and the warnings Python would print (its default filters) are
    appended to its stderr. Any other script runs as a user runs it (run_entry)."""
    import contextlib
    import io
    import signal
    import warnings

    import torch

    from bnlab import hydra_setup

    if script == "bnlab/lab/sweep.py":  # its argparse main(argv), as the script calls it
        from bnlab.lab import sweep

        def call():
            sys.exit(sweep.main(list(args)))
    elif script not in ("train.py", "evaluate.py"):  # anything else: as a user runs it
        return run_entry(script, *args, cwd=cwd, env=env)
    else:
        entry = _entry(script)
        name = "evaluate" if Path(script).stem == "evaluate" else "train"

        def call():
            entry.precheck.check_or_exit(list(args), name)
            entry.main()
    out, err = io.StringIO(), io.StringIO()
    saved = (sys.argv, os.getcwd(), dict(os.environ), torch.get_num_threads(),
             {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1,
                                               signal.SIGUSR2)})
    os.environ.pop("BNLAB_RUN_STAMP", None)
    saved_stamp, hydra_setup._stamp = hydra_setup._stamp, None
    for k, v in (env or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    os.environ["PYTHONUNBUFFERED"] = "1"
    code = 0
    try:
        os.chdir(cwd)
        sys.argv = [str(ROOT / script), *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")   # once per place, as `python script` shows them
            for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                          ResourceWarning):     # what Python hides outside __main__
                warnings.filterwarnings("ignore", category=quiet)
            try:
                call()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # as an uncaught exception ends `python script`
                import traceback

                traceback.print_exc()
                code = 1
            for w in caught:
                err.write(warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
    finally:
        hydra_setup._stamp = saved_stamp
        sys.argv = saved[0]
        os.chdir(saved[1])
        os.environ.clear()
        os.environ.update(saved[2])
        torch.set_num_threads(saved[3])
        for s, h in saved[4].items():
            signal.signal(s, h)
    return subprocess.CompletedProcess(sys.argv, code, out.getvalue(), err.getvalue())


def run_dirs(root: Path) -> list[Path]:
    """Every directory under `root` that holds a run's files."""
    return sorted(p.parent for p in root.rglob("config.yaml"))


def tiny_spec(tmp_path: Path, num_train: int = 64):
    """Two cells on generated data, a few steps each: the runner's real code path (a
    sweep's Spec, for the sweep tests on this machine and on stand-ins for SLURM)."""
    from bnlab.lab.spec import load_spec

    spec = tmp_path / "tiny" / "sweep.yaml"
    spec.parent.mkdir()
    ov = (f"[model=resnet20, data=synthetic, data.num_train={num_train}, data.num_val=32, "
          "epochs=1, "
          "batch_per_gpu=4, eval_every=1, dist.simulate=2, diagnostics.enabled=false{}]")
    spec.write_text("experiment: demo\nseeds: [0]\ncells:\n"
                    f"  - {{label: a, overrides: {ov.format('')}}}\n"
                    f"  - {{label: b, overrides: {ov.format(', norm=gn, norm.cap_groups=true')}}}"
                    "\n")
    return load_spec(spec)


def fake_run(d: Path, accs: list[float], loss: float = 1.0, status: str = "completed",
             precise: float | None = None) -> None:
    """A run directory as the trainer writes it, with chosen val acc values."""
    import json

    from bnlab.rundir import set_status

    d.mkdir(parents=True)
    rows = [{"step": i, "epoch": (i + 1) / 5, "val/acc": a} for i, a in enumerate(accs)]
    rows.append({"step": 99, "epoch": 5, "train/loss": loss, "train_epoch/loss": loss,
                 "time/train_s": 10.0, **({"val/acc_precise": precise} if precise else {})})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "run.json").write_text(json.dumps({"commit": "abc", "host": "h", "device": "cpu"}))
    (d / "sweep.json").write_text(json.dumps({"wall_s": 60.0}))
    set_status(d, status)


class Means:
    """A table cell with a given final val acc, as the verdict rules read it."""

    def __init__(self, final: float):
        self.final = final

    def stat(self, key: str):
        from bnlab.lab.analysis import Stat

        return Stat.of([self.final])


def build_table(table, tag: str, root: Path, experiments: Path):
    """`table` built from the runs under `root`/`tag` into `experiments`/<name>/."""
    from bnlab.lab.table import Context, build

    return build(table, Context(table, experiments, root, tag))


def fake_headline_run(d: Path, accs: list[float], *, epochs: int = 20, decomp=None,
                      batch: bool = False, precise: float | None = None, info: dict | None = None,
                      seed: int = 0, churn: bool = False, images: int = 1000):
    """A finished headline-protocol run (10 evaluations an epoch) at these val accs, read back.
    Its predictions: the first acc% of the `images` right; with `churn`, a fresh random subset
    of that size at each evaluation (prediction churn, so a churn floor). `decomp`: the same
    weights' val acc with PreciseBN statistics at each evaluation (`batch`: with batch
    statistics too, and the predictions of both); `precise`: val acc after PreciseBN at each
    epoch end, this many points above."""
    import json

    import yaml

    from bnlab.lab.results import Run
    from bnlab.metrics import PREDICTIONS
    from bnlab.rundir import set_status

    d.mkdir(parents=True)
    metrics, preds = fake_headline_texts(tuple(accs), epochs, None if decomp is None else
                                         tuple(decomp), batch, precise, seed, churn, images)
    (d / "metrics.jsonl").write_text(metrics)
    (d / PREDICTIONS).write_text(preds)
    (d / "run.json").write_text(json.dumps({"commit": "abc", "host": "h", "device": "cpu",
                                            **(info or {})}))
    (d / "config.yaml").write_text(yaml.safe_dump({"data": {"holdout": 0}}))
    set_status(d, "completed")
    return Run.read(d, seed)


@functools.lru_cache(maxsize=4096)
def fake_headline_texts(accs: tuple, epochs: int, decomp: tuple | None, batch: bool,
                        precise: float | None, seed: int, churn: bool, images: int
                        ) -> tuple[str, str]:
    """fake_headline_run's metrics.jsonl and predictions.jsonl, once for each set of
    arguments: the claims' tests build the same runs again and again (over a thousand a
    session, 100 evaluations of 1,000 images each), and the texts depend on nothing else."""
    import json

    import numpy as np

    from bnlab.metrics import encode_classes

    rng = np.random.default_rng(seed)
    kinds = ("ema", "precise", "batch") if batch else ("ema",)
    rows, preds = [], [json.dumps({"step": 0, "labels": encode_classes(np.zeros(images))})]
    for i, a in enumerate(accs):
        ep = (i + 1) / 10
        row = {"step": i + 1, "epoch": ep, "val/acc": a, "val/loss": 2.0 - a / 100}
        if decomp is not None:
            row.update({"decomp/acc_precise": decomp[i], "decomp/loss_precise": 1.0})
        if batch:
            row.update({"decomp/acc_batch": 10.0, "decomp/loss_batch": 2.3})
        if precise is not None and abs(ep - round(ep)) < 1e-9:
            row["val/acc_precise"] = a + precise
        rows.append(row)
        k = round(a * images / 100)
        right = (rng.permutation(images) if churn else np.arange(images)) < k
        # class 1 where wrong (the labels are all 0); zlib's fastest level, as a session's
        # fake runs write some 400,000 of these and level 9 took 0.1 ms for each random mask
        wrong = encode_classes((~right).astype(np.uint8), level=1)
        preds += [json.dumps({"step": i + 1, "epoch": ep, "kind": kind, "pred": wrong})
                  for kind in kinds]
    rows.append({"step": 999, "epoch": epochs, "train/loss": 1.0, "train_epoch/loss": 1.0})
    return "".join(json.dumps(r) + "\n" for r in rows), "\n".join(preds) + "\n"
