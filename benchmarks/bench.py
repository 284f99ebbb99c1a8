"""`make bench`: how fast bnlab trains on this machine, each figure measured side by side
with its reference in one run and compared with its target.

    uv run python benchmarks/bench.py [--only overhead,sim,...] [--quick] [--out FILE]

Prints a table per section as it goes and writes every figure to `--out` (JSON, default
benchmarks/results/<host>.json); `python benchmarks/perfdoc.py` turns that file into
docs/performance.md. Run it on a quiet machine: other work on the cores skews the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import measure as m  # noqa: E402

from bnlab.rundir import git_commit  # noqa: E402

CELL = ["norm=bn", "dist.simulate=4"]  # the table-jitter cell: resnet18, 4 simulated ranks x 2
CELL_STEPS, CELL_EVALS = 3175, 25  # its 5 epochs of 635 steps on 5,085 images, 5 evals/epoch
# The headline cell: CELL's layout on resnet20. Its 20 epochs of 635 steps; evaluations: one
# per epoch over the first half, 10 per epoch on the plateau (configs/experiment/headline.yaml:
# eval_every 10, eval_sparse_until 0.5).
HEADLINE_STEPS, HEADLINE_EVALS = 12700, 110
PACK = (1, 2, 4, 8, 16)  # runs side by side on one GPU


class Bench:
    """Collects rows; each row is one figure against its reference (and target, if any)."""

    def __init__(self, quick: bool, sections: tuple[str, ...] = ()):
        self.quick, self.rows, self.current = quick, [], ""  # current: the SECTIONS key
        self.sections = sections  # every section this run measures

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def row(self, section: str, what: str, value: float, unit: str, ref: float | None = None,
            ref_what: str = "", target: str = "", met: bool | None = None, note: str = "",
            **keys):
        """One figure; `keys` (e.g. fix=) let a table find its row."""
        r = {"bench": self.current, "section": section, "what": what, "value": value,
             "unit": unit, "ref": ref, "ref_what": ref_what,
             "ratio": value / ref if ref else None, "target": target, "met": met, "note": note,
             **keys}
        self.rows.append(r)
        shown = f"{value:.4g} {unit}"
        if ref:
            shown += f" vs {ref:.4g} ({ref_what}): {r['ratio']:.3f}x"
        verdict = "" if met is None else ("  [target met]" if met else "  [target MISSED]")
        print(f"  {what}: {shown}{'  target ' + target if target else ''}{verdict}", flush=True)


def overhead(b: Bench) -> None:
    """bnlab's training step vs a bare loop, alternating, at 8 and 128 images per step."""
    for batch, steps, every in ((8, b.n(110, 20), 10), (128, b.n(24, 8), 4)):
        ours, bare = [], []
        for _ in range(b.n(4, 1)):
            ours += m.trainer_step_s("resnet18", batch, steps, every)
            bare += m.bare_step_s("resnet18", batch, steps, every)[0]
        t, ref = m.median(ours), m.median(bare)
        b.row("overhead", f"trainer step, resnet18, {batch} images", t, "s/step", ref,
              "bare PyTorch loop", "<= 1.05x", t / ref <= 1.05)


def data_pipeline(b: Bench) -> None:
    """Producing one augmented global batch, as a share of the step that consumes it."""
    batch = 8
    load = m.median(m.loader_s(batch, b.n(400, 50)))
    step = m.median(m.trainer_step_s("resnet18", batch, b.n(60, 20), 10))
    b.row("data", f"loader, one augmented batch of {batch}", load, "s", step,
          "trainer step (resnet18)", "<= 3%", load / step <= 0.03)


def simulation(b: Bench) -> None:
    """One process simulating 4 ranks x 2 vs 4 real gloo processes x 2, per step."""
    steps, warm = b.n(30, 6), b.n(5, 2)
    sim = m.median(m.ddp_step_s("resnet18", "bn", 2, steps, warm, simulate=4))
    real = m.real_ddp(4, "resnet18", "bn", 2, steps, warm)
    b.row("sim", "real 4-process gloo DDP x 2, bn", real, "s/step", sim,
          "simulated 4 x 2 (1 process)", ">= 3x", real / sim >= 3,
          note="ratio = speed-up of the simulation")


def syncbn_cost(b: Bench) -> None:
    """syncbn (and the naive sync) vs bn in real gloo DDP at 2 and 4 processes."""
    steps, warm = b.n(30, 6), b.n(5, 2)
    for world, batch in ((2, 2), (4, 2), (2, 32)):
        bn = m.real_ddp(world, "resnet18", "bn", batch, steps // (1 + batch // 8), warm)
        for norm in ("syncbn", "syncbn_naive") if batch == 2 else ("syncbn",):
            t = m.real_ddp(world, "resnet18", norm, batch, steps // (1 + batch // 8), warm)
            target = "<= 1.15x" if norm == "syncbn" and batch == 2 else ""
            b.row("syncbn", f"{norm}, {world}-process gloo, resnet18 x {batch}", t, "s/step",
                  bn, f"bn, {world}-process gloo", target, t / bn <= 1.15 if target else None)
        local = m.real_ddp(world, "resnet18", "syncbn", batch, steps // (1 + batch // 8), warm,
                           local_sync=True)
        b.row("syncbn", f"syncbn without its collectives, {world}-process gloo, resnet18 x "
              f"{batch}", local, "s/step", bn, f"bn, {world}-process gloo",
              note="computation only: collectives replaced by local copies")


def precisebn_cost(b: Bench) -> None:
    """One recalibration of 4,096 images vs one epoch of training (table-jitter cell)."""
    samples = b.n(4096, 512)
    pb = m.precise_bn_s("resnet18", 4, 32, samples)
    step = m.median(m.ddp_step_s("resnet18", "bn", 2, b.n(30, 6), 3, simulate=4))
    epoch = step * CELL_STEPS / 5
    b.row("precisebn", f"PreciseBN, {samples} images, 4 x 32 per batch", pb, "s", epoch,
          f"one epoch (635 steps x {step:.4f} s, simulated 4 x 2)",
          note="fraction of an epoch")


# table-recover's fixes as its spec runs them, by its fix names (the rows' `fix`, which its
# page reads): a label and configs/norm/<kind>.yaml with these keys set. bn + PreciseBN
# steps as bn does; its recalibration is the precisebn section.
FIX_NORMS = {"syncbn": ("syncbn", "syncbn", {}),
             "syncbn2": ("syncbn, groups of 2", "syncbn", {"sync_group": 2}),
             "gn": ("gn (8 groups)", "gn", {"groups": 8}),
             "gn32": ("gn (32 groups, capped)", "gn", {"cap_groups": True}),
             "gnws": ("gnws (8 groups)", "gnws", {"groups": 8}),
             "ln": ("ln", "ln", {}), "evonorm": ("evonorm (8 groups)", "evonorm", {"groups": 8}),
             "evonorm32": ("evonorm (32 groups, capped)", "evonorm", {}),
             "brn": ("brn", "brn", {}),
             "frozen_bn": ("frozen BN (once frozen)", "frozen_bn", {"freeze_after": 0})}


def norm_cfg(kind: str, keys: dict | None = None) -> dict:
    """configs/norm/<kind>.yaml with `keys` set: the norm as a run configures it."""
    import yaml

    return {**yaml.safe_load((HERE.parent / "configs" / "norm" / f"{kind}.yaml").read_text()),
            **(keys or {})}


def fixes_cost(b: Bench) -> None:
    """Each of table-recover's fixes vs bn per step: resnet20, 4 simulated ranks x 2, on CPU."""
    steps, warm = b.n(40, 6), b.n(5, 2)
    for fix, (label, kind, keys) in FIX_NORMS.items():
        ours, bn = [], []
        for _ in range(b.n(3, 1)):  # alternating, so drift in the machine hits both alike
            bn += m.ddp_step_s("resnet20", norm_cfg("bn"), 2, steps, warm, simulate=4)
            ours += m.ddp_step_s("resnet20", norm_cfg(kind, keys), 2, steps, warm, simulate=4)
        b.row("fixes", f"{label}, resnet20, simulated 4 x 2", m.median(ours), "s/step",
              m.median(bn), "bn, simulated 4 x 2",
              note="CPU, one process; PreciseBN's cost: the precisebn section", fix=fix)


def eval_throughput(b: Bench) -> None:
    """Evaluation images/s at batch 256 (and resnet18 step images/s for scale)."""
    n = b.n(1024, 256)
    for model in ("resnet18", "resnet18_cifar"):
        t = m.eval_s(model, 256, n)
        b.row("eval", f"evaluation, {model}, batch 256", n / t, "images/s",
              note=f"{n} images in {t:.2f} s")


def gpu(b: Bench) -> None:
    """CUDA: resnet18 images/s, simulated 4 x 2 vs 1 x 8, SyncBN per layer, evaluation."""
    if not torch.cuda.is_available():
        print("  no CUDA device here: nothing measured (run `make test-gpu` on a GPU machine)")
        return
    name = torch.cuda.get_device_name(0)  # every row names the device: never a CPU figure
    steps, warm = b.n(50, 8), b.n(10, 3)
    for batch in (8, 512):
        t = m.median(m.ddp_step_s("resnet18", "bn", batch, steps, warm, device="cuda"))
        b.row("gpu", f"{name}: resnet18 training step, {batch} images", batch / t, "images/s",
              note=f"{t * 1000:.2f} ms/step")
    sim = m.median(m.ddp_step_s("resnet18", "syncbn", 2, steps, warm, simulate=4,
                                device="cuda"))
    one = m.median(m.ddp_step_s("resnet18", "bn", 8, steps, warm, device="cuda"))
    b.row("gpu", f"{name}: simulated 4 x 2 (syncbn), resnet18", sim, "s/step", one,
          "1 rank x 8 (bn)", note="ratio = the simulation's cost on one GPU")
    # resnet18's first and last BN stage at 8 images of 32x32 (ImageNet stem: 8x8, 1x1), and
    # its first stage at an ImageNet batch of 256 images of 224x224 (56x56).
    for shape in ((8, 64, 8, 8), (8, 512, 1, 1), (256, 64, 56, 56)):
        t = m.syncbn_layer_s(shape, b.n(200, 20), b.n(20, 3))
        ref = t["torch BatchNorm, no sync"]
        for impl in ("torch SyncBatchNorm", "bnlab syncbn"):
            b.row("gpu", f"{name}: {impl}, one layer {tuple(shape)}, forward + backward",
                  t[impl], "s", ref, "torch BatchNorm, no sync")
    n = b.n(10000, 1024)
    for model in ("resnet18", "resnet18_cifar"):
        t = m.eval_s(model, 256, n, device="cuda")
        b.row("gpu", f"{name}: evaluation, {model}, batch 256", n / t, "images/s",
              note=f"{n} images in {t:.2f} s")
    packing(b, "cuda")


# The precision section's variants: (label, precision, channels_last); the first is each
# row's reference, measured alternately with the others in one run.
VARIANTS = (("fp32", "fp32", False), ("bf16", "bf16", False),
            ("fp32 channels_last", "fp32", True), ("bf16 channels_last", "bf16", True))
LAYOUTS = ((4, 2), (1, 8))  # simulated ranks x images: the break and its reference


def precision(b: Bench) -> None:
    """bf16 autocast and channels_last against fp32 per training step (resnet20, resnet18;
    4 x 2 simulated and 1 x 8), alternating; then the packing rows in fp32 and bf16 (on CUDA;
    on the CPU only with --quick, K = 1 and 2, to check the code path)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = m.device_name(device)  # every row names its device
    steps, warm = b.n(50, 4), b.n(10, 2)
    for model in ("resnet20", "resnet18"):
        for world, batch in LAYOUTS:
            norm = "syncbn" if world > 1 else "bn"  # the recovered cell, and its reference
            times: dict[str, list[float]] = {v[0]: [] for v in VARIANTS}
            for _ in range(b.n(3, 1)):  # alternating, so drift in the machine hits all alike
                for label, prec, cl in VARIANTS:
                    times[label] += m.ddp_step_s(model, norm, batch, steps, warm,
                                                 simulate=world, device=device,
                                                 precision=prec, channels_last=cl)
            ref = m.median(times["fp32"])
            for label, *_ in VARIANTS:
                b.row("precision", f"{name}: {model} {world} x {batch} ({norm}), {label}",
                      m.median(times[label]), "s/step", None if label == "fp32" else ref,
                      "" if label == "fp32" else "fp32, contiguous", precision=label,
                      model=model, layout=f"{world}x{batch}")
    if device == "cuda" or b.quick:
        ks = (1, 8, 16) if device == "cuda" else (1, 2)
        # fp32's packing rows are the gpu section's where it runs too (not measured twice)
        both = device != "cuda" or "gpu" not in b.sections
        for prec in ("fp32", "bf16") if both else ("bf16",):
            packing(b, device, ks, prec)


def packing(b: Bench, device: str, ks: tuple[int, ...] = PACK, precision: str = "fp32") -> None:
    """K runs of the headline cell side by side on one `device`, each its own process with
    cores / K threads, all starting together (a barrier once each has imported): each one's
    step time measured while all K train, then its evaluation time (the others evaluate or
    have finished then: a lower bound of its cost beside K runs), and the headline runs per
    hour they give (estimated from those times, as the threads section). `precision`: the
    runs' (bf16 rows are named so)."""
    cores, name = os.cpu_count() or 1, m.device_name(device)
    tag = "" if precision == "fp32" else f", {precision}"
    steps, per_hour = b.n(200, 12), {}
    for k in ks:
        threads = max(1, cores // k)
        with tempfile.TemporaryDirectory() as barrier:
            res = _results([_worker("headline", steps, threads, device, barrier, k, precision)
                            for _ in range(k)])
        step, ev = m.median([r[0] for r in res]), m.median([r[1] for r in res])
        run_s = HEADLINE_STEPS * step + HEADLINE_EVALS * ev
        per_hour[k] = k * 3600 / run_s
        b.row("packing", f"{name}: {k} run(s) side by side{tag}, step", step, "s/step",
              note=f"{threads} thread(s) each; evaluation {ev:.2f} s; one run {run_s / 60:.1f} "
              "min", precision=precision)
    for k, rate in per_hour.items():
        b.row("packing", f"{name}: {k} run(s) side by side{tag}", rate, "runs/h",
              per_hour[ks[0]], f"{ks[0]} run{tag}", note="headline cell (resnet20 4 x 2, 20 "
              "epochs), estimated from the measured step and evaluation times",
              precision=precision)


def _worker(fn: str, *args, **kw) -> subprocess.Popen:
    """This script in worker mode: one measurement in its own process (for concurrency)."""
    spec = json.dumps({"fn": fn, "args": args, "kw": kw})
    return subprocess.Popen([sys.executable, __file__, "--worker", spec], text=True,
                            stdout=subprocess.PIPE)


def _results(procs: list[subprocess.Popen]) -> list:
    outs = [p.communicate()[0] for p in procs]
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def cell_rate(b: Bench, jobs: int, threads: int) -> tuple[float, float]:
    """(s/step, s/eval) of the table-jitter cell with `jobs` runs side by side."""
    steps = b.n(60, 12)
    procs = [_worker("cell", steps, threads) for _ in range(jobs)]
    res = _results(procs)
    return (m.median([r[0] for r in res]), m.median([r[1] for r in res]))


def threads_and_sweep(b: Bench) -> None:
    """Threads per process and parallel jobs on this machine: steps of the table-jitter cell,
    and the runs per hour they give (5 epochs: 3,175 steps and 25 evaluations per run)."""
    cores = os.cpu_count() or 1
    layouts = [(1, 1), (1, cores), (cores, 1), (cores, cores)]  # the last oversubscribes
    per_hour = {}
    for jobs, threads in dict.fromkeys(layouts):
        step, ev = cell_rate(b, jobs, threads)
        run_s = CELL_STEPS * step + CELL_EVALS * ev
        per_hour[(jobs, threads)] = jobs * 3600 / run_s
        b.row("threads", f"{jobs} job(s) x {threads} thread(s): step", step, "s/step",
              note=f"evaluation {ev:.2f} s; one run = {run_s / 60:.1f} min")
    base = per_hour[(1, cores)]
    for (jobs, threads), rate in per_hour.items():
        b.row("sweep", f"{jobs} job(s) x {threads} thread(s)", rate, "runs/h", base,
              f"1 job x {cores} threads", note="table-jitter cell, estimated from the steps")


def compile_speedup(b: Bench) -> None:
    """torch.compile (inductor) on the bare loop (step time and compile time), and the
    trainer's `compile=true` against its eager step."""
    steps = b.n(60, 20)
    eager, t0_e = m.bare_step_s("resnet18", 8, steps, 10)
    comp, t0_c = m.bare_step_s("resnet18", 8, steps, 10, compile_model=True)
    b.row("compile", "torch.compile, resnet18, 8 images", m.median(comp), "s/step",
          m.median(eager), "eager", note=f"first step {t0_c:.1f} s vs {t0_e:.2f} s eager")
    for kind in ("bn", "brn"):  # brn: its ramp moves every step, and must not recompile
        on = ["dist.simulate=4", f"norm={kind}"]
        ref = m.trainer_step_s("resnet20", 2, b.n(120, 40), b.n(20, 10), on, threads=1)
        comp = m.trainer_step_s("resnet20", 2, b.n(120, 40), b.n(20, 10), [*on, "compile=true"],
                                threads=1)
        b.row("compile", f"train.py compile=true, resnet20, {kind}, 4 simulated ranks x 2",
              m.median(comp), "s/step", m.median(ref), "compile=false",
              note="the trainer's own step, 1 thread; the first interval (compiling) dropped")


def channels_last(b: Bench) -> None:
    """channels-last memory format on the bare loop, at 8 and 128 images."""
    for batch, steps, every in ((8, b.n(60, 20), 10), (128, b.n(16, 8), 4)):
        cl, ref = [], []
        for _ in range(b.n(2, 1)):
            cl += m.bare_step_s("resnet18", batch, steps, every, channels_last=True)[0]
            ref += m.bare_step_s("resnet18", batch, steps, every)[0]
        b.row("channels_last", f"channels-last, resnet18, {batch} images", m.median(cl),
              "s/step", m.median(ref), "contiguous (default)")


def preempt_check(b: Bench) -> None:
    """The trainer's per-step preemption agreement (max all-reduce) in real 2-process DDP."""
    steps, warm = b.n(60, 10), b.n(5, 2)
    every, without = [], []
    for _ in range(b.n(2, 1)):
        every.append(m.real_ddp(2, "resnet18", "bn", 2, steps, warm, check_stop=True))
        without.append(m.real_ddp(2, "resnet18", "bn", 2, steps, warm))
    b.row("preempt", "agreement at every step (the trainer), 2-process gloo", m.median(every),
          "s/step", m.median(without), "no agreement")


def report_inputs(b: Bench) -> None:
    """What `make report` reads before it computes anything: every cell of a sweep spec
    composed (from the kept compositions against Hydra's own), and the runs' config.yaml
    parsed (libyaml against PyYAML's pure-Python parser)."""
    import glob

    import yaml

    from bnlab.lab import spec
    from bnlab.lab.results import SAFE_LOADER
    from bnlab.paths import EXPERIMENTS

    path = EXPERIMENTS / "practice" / "sweep.yaml"
    cells = len(yaml.safe_load(path.read_text())["cells"])
    hydra, kept = [], []
    before = os.environ.get("BNLAB_CACHE")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["BNLAB_CACHE"] = tmp
            spec.load_spec(path)  # the cache filled
            for _ in range(b.n(3, 1)):
                os.environ["BNLAB_CACHE"] = "off"
                spec.base.cache_clear()  # no group choice composed before in this process
                t = time.perf_counter()
                spec.load_spec(path)
                hydra.append(time.perf_counter() - t)
                os.environ["BNLAB_CACHE"] = tmp
                t = time.perf_counter()
                spec.load_spec(path)
                kept.append(time.perf_counter() - t)
    finally:  # the user's own setting back
        os.environ.pop("BNLAB_CACHE", None)
        if before is not None:
            os.environ["BNLAB_CACHE"] = before
    b.row("report", f"table-practice's spec, its {cells} cells composed", m.median(kept), "s",
          m.median(hydra), "Hydra, each cell (BNLAB_CACHE=off)",
          note="a config file or override changed composes again through Hydra")
    two, one = compose_steps(b)
    b.row("report", f"every committed cell ({two[1]}) composed in two steps", m.median(two[0]),
          "s", m.median(one), "Hydra's one-step compose of each",
          note="the group choices once each, the other overrides by Hydra's own function")
    texts = [Path(f).read_text() for f in sorted(glob.glob(
        str(EXPERIMENTS / "runs*" / "**" / "config.yaml"), recursive=True))]
    texts = texts[:b.n(len(texts), 100)]
    fast, slow = [], []
    for _ in range(b.n(3, 1)):
        t = time.perf_counter()
        [yaml.load(x, Loader=SAFE_LOADER) for x in texts]
        fast.append(time.perf_counter() - t)
        t = time.perf_counter()
        [yaml.safe_load(x) for x in texts]
        slow.append(time.perf_counter() - t)
    b.row("report", f"the committed runs' config.yaml, {len(texts)} parsed", m.median(fast), "s",
          m.median(slow), "yaml.safe_load (pure Python)", note=f"loader {SAFE_LOADER.__name__}")


def compose_steps(b: Bench) -> tuple[tuple[list[float], int], list[float]]:
    """spec.hydra_compose (the group choices composed once each, the other overrides applied)
    against Hydra's compose of all the overrides at once, on every committed cell (without
    the kept compositions, and nothing composed before in the process)."""
    from hydra import initialize_config_dir

    from bnlab.lab import spec
    from bnlab.paths import CONFIGS

    cells = spec.committed_cells()
    cells = cells[:b.n(len(cells), 20)]
    two, one = [], []
    for _ in range(b.n(3, 1)):
        spec.base.cache_clear()
        t = time.perf_counter()
        [spec.hydra_compose(list(ov)) for ov in cells]
        two.append(time.perf_counter() - t)
        t = time.perf_counter()
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            [spec.compose_whole(list(ov)) for ov in cells]
        one.append(time.perf_counter() - t)
    return (two, len(cells)), one


SECTIONS: dict[str, Callable[[Bench], None]] = {
    "overhead": overhead, "data": data_pipeline, "sim": simulation, "syncbn": syncbn_cost,
    "precisebn": precisebn_cost, "fixes": fixes_cost, "eval": eval_throughput,
    "threads": threads_and_sweep, "compile": compile_speedup, "channels_last": channels_last,
    "preempt": preempt_check, "gpu": gpu, "precision": precision, "report": report_inputs,
}


def wait_for_all(barrier: Path, k: int, timeout_s: float = 600) -> None:
    """Say this worker is ready (a file in `barrier`) and wait until all `k` are."""
    (barrier / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(barrier.glob("ready-*"))) < k:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(list(barrier.glob('ready-*')))} of {k} workers "
                               f"started within {timeout_s:.0f} s")
        time.sleep(0.05)


def worker(spec: str) -> None:
    s = json.loads(spec)
    if s["fn"] == "cell":
        steps, threads = s["args"]
        step = m.median(m.trainer_step_s("resnet18", 2, steps, 6, CELL, threads=threads))
        out = (step, m.eval_s("resnet18", 256, 1017))
    elif s["fn"] == "headline":
        steps, threads, device, barrier, k, prec = s["args"]
        wait_for_all(Path(barrier), k)
        step = m.median(m.trainer_step_s("resnet20", 2, steps, 6, [*CELL, f"precision={prec}"],
                                         threads=threads, device=device))
        out = (step, m.eval_s("resnet20", 256, 1017, device=device, precision=prec))
    else:
        out = getattr(m, s["fn"])(*s["args"], **s["kw"])
    print(json.dumps(out))


def machine() -> dict:
    from bnlab.rundir import machine as describe

    return {"machine": describe(), "host": socket.gethostname(),
            "python": platform.python_version(), "torch": torch.__version__}


def save(out: Path, info: dict, run: dict, rows: list[dict]) -> None:
    """Write this run's rows into `out`, keeping the sections it did not measure (from an
    earlier run on the same machine); a file from another machine is kept as `.prev`."""
    res = {"machine": info, "runs": [], "rows": []}
    if out.is_file():
        old = json.loads(out.read_text())
        if old.get("machine") == info:
            res = old
        else:
            out.rename(out.with_name(out.name + ".prev"))
            print(f"kept the results of another machine as {out.name}.prev")
    res["rows"] = [r for r in res["rows"] if r["bench"] not in run["sections"]]
    res["runs"] = [r for r in res["runs"] if any(x["run"] == r["id"] for x in res["rows"])]
    run["id"] = max((r["id"] for r in res["runs"]), default=-1) + 1
    res["runs"].append(run)
    res["rows"] += [{**r, "run": run["id"]} for r in rows]
    order = list(SECTIONS)
    res["rows"].sort(key=lambda r: order.index(r["bench"]))  # stable: a section's rows in order
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(SECTIONS),
                   help=f"comma-separated sections (default all): {', '.join(SECTIONS)}")
    p.add_argument("--quick", action="store_true", help="few steps: checks the code paths only")
    p.add_argument("--out", type=Path, help="JSON results (default benchmarks/results/<host>.json)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker)
        return 0
    chosen = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        print(f"bench: error: unknown section(s) {', '.join(unknown)}; choose from "
              f"{', '.join(SECTIONS)}.", file=sys.stderr)
        return 2
    out = a.out or HERE / "results" / f"{socket.gethostname()}.json"
    b, info, t0 = Bench(a.quick, tuple(chosen)), machine(), time.perf_counter()
    commit = git_commit()  # the code measured: taken before the run, not after it
    print(f"machine: {info['machine']}; torch {torch.__version__}"
          f"{' (quick: code paths only)' if a.quick else ''}")
    for name in chosen:
        print(f"\n[{name}] {SECTIONS[name].__doc__.splitlines()[0]}", flush=True)
        b.current = name
        SECTIONS[name](b)
    run = {"command": "python benchmarks/bench.py " + " ".join(sys.argv[1:]),
           "commit": commit, "date": time.strftime("%Y-%m-%d"), "quick": a.quick,
           "sections": chosen, "wall_s": round(time.perf_counter() - t0, 1)}
    save(out, info, run, b.rows)
    print(f"\nwrote {out} ({(time.perf_counter() - t0) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
