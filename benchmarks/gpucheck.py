"""`make gpu-check OUT=DIR`: bnlab's whole CUDA check as one command, for a GPU machine lent
for minutes (docs/training.md gives the exact call).

    python benchmarks/gpucheck.py --out DIR [--data CIFAR_DIR] [--minutes 8]
    python benchmarks/gpucheck.py --out DIR --rehearse   # on CPU: every step's code path

Steps, in order, each in its own process and with its own time limit, none stopping the
next (a failure is written down and the check goes on):

1. env        torch, CUDA, the GPU, the commit of the code.
2. tests      the cuda tests (`pytest -m cuda`).
3. sim        the simulation's first SGD steps in float64 on CUDA and on the CPU (bn, and
              syncbn in groups): every parameter and running statistic within 1e-10.
4. syncbn     bnlab's SyncBN function against torch's SyncBatchNorm kernels and torch's
              BatchNorm on the batch (a one-rank NCCL group), float32 and bf16 autocast.
5. bench      benchmarks/bench.py's gpu and precision sections (--bench picks them): bf16 and
              channels_last against fp32 per step, the packing rows (K runs side by side) in
              fp32 and bf16.
6. values     table-values' cells on this GPU (its GPU-only bf16 cells among them, rule v6),
              packed at the K the bench found fastest (or --runs-per-gpu), into
              their own runs folder, until the time left runs out (--stop-after); their logs
              (no checkpoints) tarred into DIR.

Writes five files into DIR: check.json (every step's figures), summary.txt (one line per
step), log.txt (every child's output), bench.json (benchmarks/results/ format) and
runs-cuda.tar.gz (the values runs' folders).
Exit status 0 when every step passed, 1 otherwise. `--rehearse` runs the same steps with the
CPU standing in for CUDA where it can (its figures are never a GPU's: each names its device).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bnlab.paths import EXPERIMENTS, RUNS_CUDA  # noqa: E402  (RUNS_CUDA: never the CPU's runs)

VALUES_SPEC = EXPERIMENTS / "values" / "sweep.yaml"
# table-values' inputs, the first first: each input's cells and its reference complete before
# the next input starts, so a short slot finishes whole cells (the CPU plan runs seed-major).
VALUES_FIRST = ("resnet18 32 px", "resnet18 32 px bf16", "resnet20", "resnet18 64 px")
SIM_TOL, SIM_STEPS = 1e-10, 3
VALUES_EPOCHS, HEADLINE_EPOCHS = 10, 20  # a values run's epochs; the bench's packed cell's
TAR_S = 30  # kept back from the values slot for tarring and writing


# -- the checks that run here (each in a child process: `--step NAME`) --------------------------

def step_env(device: str) -> dict:
    import platform

    import torch

    from bnlab.rundir import git_commit, machine

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda_available": torch.cuda.is_available(), "machine": machine(),
            "commit": git_commit(), "device": device}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpus=torch.cuda.device_count(), cuda=torch.version.cuda,
                    memory_gib=round(p.total_memory / 2**30, 1),
                    nccl=str(torch.cuda.nccl.version()))
    ok = device == "cpu" or torch.cuda.is_available()
    said = (f"torch {torch.__version__}, python {info['python']}, "
            f"{info.get('gpu', 'no CUDA device')}, commit {info['commit']}")
    return {"ok": ok, "said": said, **info}


def _first_steps(device: str, kind: str, opts: dict) -> dict:
    """Parameters and buffers after SIM_STEPS SGD steps of 4 simulated ranks x 2 (resnet20,
    float64), from one seed and one batch sequence."""
    import torch

    from bnlab.models import build_model
    from bnlab.norms import convert
    from bnlab.simulate import SimulatedDDP

    torch.manual_seed(0)
    net = SimulatedDDP(convert(build_model("resnet20"), kind, **opts), 4).double().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(1)
    for _ in range(SIM_STEPS):
        x = torch.randn(8, 3, 32, 32, dtype=torch.float64, generator=gen).to(device)
        y = torch.randint(0, 10, (8,), generator=gen).to(device)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    state = {f"param {n}": p.detach().cpu() for n, p in net.named_parameters()}
    state.update({f"buffer {n}": b.detach().cpu() for n, b in net.named_buffers()
                  if b.is_floating_point()})
    for r in range(4):  # every simulated rank's running statistics
        state.update({f"rank {r} {n}": t.detach().cpu()
                      for n, t in net.rank_buffers(r).items()})
    return state


def step_sim(device: str) -> dict:
    """CUDA (or, rehearsing, the CPU) against the CPU: the largest difference of any
    parameter or running statistic after the first steps."""
    import torch

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    out, ok = {}, True
    for kind, opts in (("bn", {}), ("syncbn", {"sync_group": 2})):
        ref, got = _first_steps("cpu", kind, opts), _first_steps(device, kind, opts)
        diff = {n: (got[n] - ref[n]).abs().max().item() for n in ref}
        worst = max(diff, key=diff.get)
        scale = max(t.abs().max().item() for t in ref.values())
        out[kind] = {"max_abs_diff": diff[worst], "where": worst, "tensors": len(diff),
                     "largest_value": scale}
        ok &= diff[worst] <= SIM_TOL
    said = "; ".join(f"{k} max |diff| {v['max_abs_diff']:.2e} ({v['tensors']} tensors)"
                     for k, v in out.items())
    return {"ok": ok, "said": f"{device} vs cpu, float64, {SIM_STEPS} SGD steps of 4 "
            f"simulated ranks x 2, resnet20: {said} (tolerance {SIM_TOL:g})", **out}


def _syncbn_case(impls: dict, shape: tuple, layout: str, bf16: bool, device) -> dict:
    """One layer's output, gradients and running statistics per implementation, as the
    largest difference from torch's BatchNorm on the batch."""
    import torch
    import torch.nn as nn

    from bnlab.batchnorm import RankBatchNorm

    torch.manual_seed(0)
    x = torch.randn(shape, device=device) * 3 + 1
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    c = shape[1]
    ref = nn.BatchNorm2d(c, momentum=None).to(device)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    start = {k: v.clone() for k, v in ref.state_dict().items() if k != "num_batches_tracked"}
    g = torch.randn(shape, device=device)
    xr = x.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(g)
    res = {}
    for name, fn in impls.items():
        layer = RankBatchNorm(c, sync="exact", momentum=None).to(device)
        layer.load_state_dict(start, strict=False)
        xi = x.clone().requires_grad_()
        if bf16:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y = fn(xi.to(torch.bfloat16), layer, None).float()
        else:
            y = fn(xi, layer, None)
            y.backward(g)
        d = {"y": (y - yr).abs().max().item()}
        if not bf16:
            d.update(dx=(xi.grad - xr.grad).abs().max().item(),
                     dweight=(layer.weight.grad - ref.weight.grad).abs().max().item(),
                     dbias=(layer.bias.grad - ref.bias.grad).abs().max().item(),
                     running_mean=(layer.running_mean - ref.running_mean).abs().max().item(),
                     running_var=(layer.running_var - ref.running_var).abs().max().item())
        res[name] = d
    return res


def step_syncbn(device: str) -> dict:
    """bnlab's function and torch's SyncBatchNorm kernels (CUDA only) against torch's
    BatchNorm on the batch, through a one-rank process group."""
    import torch
    import torch.distributed as tdist

    from bnlab.syncbn import sync_batch_norm, torch_sync_batch_norm

    dev = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    tdist.init_process_group("nccl" if device == "cuda" else "gloo", store=tdist.HashStore(),
                             rank=0, world_size=1,
                             **({"device_id": dev} if device == "cuda" else {}))
    impls = {"bnlab": sync_batch_norm}
    if device == "cuda":  # torch has no CPU kernels for them
        impls["torch"] = torch_sync_batch_norm
    tol = {"y": 1e-4, "dx": 1e-4, "dweight": 1e-3, "dbias": 1e-3, "running_mean": 1e-5,
           "running_var": 1e-4}
    cases, ok, worst = {}, True, {}
    for shape, layout, bf16 in (((8, 16, 8, 8), "contiguous", False),
                                ((8, 16, 8, 8), "channels_last", False),
                                ((2, 64, 8, 8), "contiguous", False),
                                ((8, 512, 1, 1), "contiguous", False),
                                ((8, 16, 8, 8), "contiguous", True)):
        name = f"{tuple(shape)} {layout}{' bf16 autocast' if bf16 else ''}"
        cases[name] = _syncbn_case(impls, shape, layout, bf16, dev)
        for impl, d in cases[name].items():
            for k, v in d.items():
                limit = 5e-2 if bf16 else tol[k]
                ok &= v <= limit
                worst[impl] = max(worst.get(impl, 0.0), v / limit)
    tdist.destroy_process_group()
    said = "; ".join(f"{impl}: worst difference {w:.2g} of its tolerance"
                     for impl, w in worst.items())
    if device != "cuda":
        said += "; torch's kernels: not run (CUDA only)"
        ok = False  # the check's point is torch's kernels
    return {"ok": ok, "said": f"{len(cases)} layer cases vs torch BatchNorm on the batch: "
            f"{said}", "cases": cases, "tolerances": tol}


STEPS = {"env": step_env, "sim": step_sim, "syncbn": step_syncbn}  # run in a child each
ORDER = ("env", "tests", "sim", "syncbn", "bench", "values")  # every step, as they run


# -- the orchestrator ---------------------------------------------------------------------------

class Check:
    def __init__(self, out: Path, minutes: float):
        self.out, self.t0, self.budget = out, time.monotonic(), 60 * minutes
        self.results: dict[str, dict] = {}

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def record(self, name: str, res: dict, wall: float) -> None:
        res = {**res, "wall_s": round(wall, 1)}
        self.results[name] = res
        line = f"{'PASS' if res.get('ok') else 'FAIL'} {name} ({wall:.0f} s): {res['said']}"
        print(line, flush=True)
        with open(self.out / "summary.txt", "a") as f:
            f.write(line + "\n")
        (self.out / "check.json").write_text(json.dumps(self.results, indent=1) + "\n")

    def child(self, cmd: list[str], timeout: float, env: dict | None = None) -> tuple:
        """(return code or None on timeout, its output, seconds) of one child process, its
        output appended to log.txt."""
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc = None
            text = "".join(s.decode() if isinstance(s, bytes) else (s or "")
                           for s in (e.stdout, e.stderr)) + f"\n[killed after {timeout:.0f} s]"
        with open(self.out / "log.txt", "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{text}\n")
        return rc, text, time.monotonic() - t0

    def step(self, name: str, device: str, timeout: float) -> None:
        cmd = [sys.executable, __file__, "--step", name, "--device", device]
        rc, text, wall = self.child(cmd, timeout)
        try:
            res = json.loads(text.strip().splitlines()[-1])
        except (json.JSONDecodeError, IndexError):
            last = text.strip().splitlines()[-1:] or ["no output"]
            res = {"ok": False, "said": f"crashed (exit {rc}): {last[0][:300]} (log.txt)"}
        self.record(name, res, wall)


def tests(c: Check, data: Path | None, timeout: float) -> None:
    env = {"BNLAB_TEST_DATA": str(data)} if data else {}
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "tests.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-rs", "-p",
               "no:cacheprovider", f"--junitxml={xml}", "tests/test_cuda.py"]
        rc, text, wall = c.child(cmd, timeout, env)
        counts = junit_counts(xml)
    said = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no result"
    skipped = [ln.rsplit(": ", 1)[-1][:80] for ln in text.splitlines() if ln.startswith("SKIP")]
    if skipped:
        said += " (skipped: " + "; ".join(dict.fromkeys(skipped)) + ")"
    ok = rc == 0 and counts.get("passed", 0) > 0 and not counts.get("failed") \
        and not counts.get("errors")
    c.record("tests", {"ok": ok, "said": said + ("" if rc is not None else ", timed out"),
                       "counts": counts, "rc": rc}, wall)


def junit_counts(xml: Path) -> dict[str, int]:
    import xml.etree.ElementTree as ET

    if not xml.is_file():
        return {}
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
            "failed": n["failures"], "errors": n["errors"], "skipped": n["skipped"]}


def bench(c: Check, quick: bool, timeout: float, sections: str = "gpu,precision"
          ) -> dict[int, float]:
    """The bench's `sections`; returns its fp32 packing rows' runs per hour by K."""
    out = c.out / "bench.json"
    cmd = [sys.executable, str(HERE / "bench.py"), "--only", sections, "--out", str(out)]
    rc, text, wall = c.child(cmd + (["--quick"] if quick else []), timeout)
    rows = json.loads(out.read_text())["rows"] if out.is_file() else []
    rate = {int(r["what"].split(": ")[1].split(" ")[0]): r["value"] for r in rows
            if r["section"] == "packing" and r["unit"] == "runs/h"
            and r.get("precision", "fp32") == "fp32"}  # the values sweep's cells: mostly fp32
    said = f"{len(rows)} rows"
    if rate:
        best = max(rate, key=rate.get)
        said += "; runs/h by K: " + ", ".join(f"{k}: {v:.1f}" for k, v in rate.items()) + \
            f" (best K={best}, {rate[best] / rate[min(rate)]:.2f}x K={min(rate)})"
    else:
        said += "; no packing rows" + ("" if rc is not None else " (timed out)")
    c.record("bench", {"ok": rc == 0 and bool(rate), "said": said, "rc": rc,
                       "runs_per_hour": rate}, wall)
    return rate


def pick_k(rate: dict[int, float], slot_s: float) -> int:
    """The values sweep's runs per GPU: the most runs per hour among the K whose one run
    (K x 3600 / rate: a headline run of 20 epochs; a values run has 10) ends, with half again
    to spare, inside the slot; else the K whose run is shortest; 1 without packing rows."""
    if not rate:
        return 1
    run_s = {k: k * 3600 / r * VALUES_EPOCHS / HEADLINE_EPOCHS for k, r in rate.items()}
    fits = [k for k in rate if 1.5 * run_s[k] <= slot_s]
    return max(fits, key=rate.get) if fits else min(run_s, key=run_s.get)


def values_spec(folder: Path) -> Path:
    """table-values' spec with its GPU-only cells (rule v6: bf16) and its inputs in
    VALUES_FIRST order (each input's cells one order): the same cells, seeds and overrides,
    so the same run folders."""
    import yaml

    raw = yaml.safe_load(VALUES_SPEC.read_text())
    raw["cells"] += raw.pop("cuda_cells", [])
    rank = {inp: i for i, inp in enumerate(VALUES_FIRST)}
    for cell in raw["cells"]:
        cell["order"] = 10 * cell.get("batch", 8) + rank.get(cell["input"], len(rank))
    path = folder / "values" / "sweep.yaml"  # the spec's name: its folder's
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def values(c: Check, data: Path | None, k: int, device: str, runs: Path) -> None:
    minutes = (c.left() - TAR_S) / 60
    if minutes < 1:
        c.record("values", {"ok": False, "said": f"not run: {c.left():.0f} s left"}, 0)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "bnlab.lab.sweep", str(values_spec(Path(tmp))),
               "--runs", str(runs), "--jobs", str(k), "--stop-after", f"{minutes:.2f}"]
        cmd += (["--data", str(data)] if data else []) + \
            (["--runs-per-gpu", str(k)] if k > 1 else [])
        if device == "cpu":
            cmd.append("--allow-dirty")  # a rehearsal's runs are never committed
        rc, text, wall = c.child(cmd, 60 * minutes + 60)
    ended = [ln.split()[0] for ln in text.splitlines() if ln.startswith("  ") and
             ln.split() and ln.split()[0] in ("completed", "diverged", "failed", "preempted")]
    counts = {s: ended.count(s) for s in dict.fromkeys(ended)}
    tar = c.out / "runs-cuda.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        if runs.is_dir():
            t.add(runs, arcname=runs.name, filter=lambda i: None if Path(i.name).name in (
                "checkpoint.pt", ".submitit") else i)
    said = (f"K={k}, {minutes:.1f} min: " + (", ".join(f"{v} {s}" for s, v in counts.items())
                                           or "no run ended") + f"; logs in {tar.name}")
    c.record("values", {"ok": counts.get("completed", 0) > 0 and not counts.get("failed"),
                        "said": said, "rc": rc, "counts": counts, "runs_per_gpu": k}, wall)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="folder for check.json, summary.txt and the logs")
    p.add_argument("--data", type=Path, help="folder holding cifar-10-batches-py")
    p.add_argument("--minutes", type=float, default=8.0,
                   help="the whole check's time; the values sweep gets what is left (default 8)")
    p.add_argument("--only", default=",".join(ORDER),
                   help=f"comma-separated steps (default all: {', '.join(ORDER)})")
    p.add_argument("--bench", default="gpu,precision",
                   help="the bench step's sections (default gpu,precision)")
    p.add_argument("--runs-per-gpu", type=int,
                   help="the values sweep's K (default: the bench's fastest)")
    p.add_argument("--runs", type=Path,
                   help="the values sweep's runs folder (default experiments/runs-cuda; "
                   "rehearsing, OUT/runs: a CPU's runs never enter the GPU's folder)")
    p.add_argument("--rehearse", action="store_true",
                   help="on CPU: the CPU stands in for CUDA, quick bench (code paths only)")
    p.add_argument("--step", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.step:
        print(json.dumps(STEPS[a.step](a.device)))
        return 0
    if a.out is None:
        p.error("--out DIR is required")
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = set(only) - set(ORDER)
    if unknown:
        print(f"gpucheck: error: unknown step(s) {', '.join(sorted(unknown))}; choose from "
              f"{', '.join(ORDER)}.", file=sys.stderr)
        return 2
    if a.data and not (a.data / "cifar-10-batches-py").is_dir():
        print(f"gpucheck: error: no cifar-10-batches-py in {a.data}; give the folder that "
              "holds it.", file=sys.stderr)
        return 2
    data = a.data.resolve() if a.data else None  # the tests run train.py from elsewhere
    a.out.mkdir(parents=True, exist_ok=True)
    for old in ("summary.txt", "log.txt"):
        (a.out / old).unlink(missing_ok=True)
    device = "cpu" if a.rehearse else "cuda"
    c = Check(a.out, a.minutes)
    for name, limit in (("env", 60), ("sim", 120), ("syncbn", 90)):
        if name in only:
            c.step(name, device, limit)
        if name == "env" and "tests" in only:
            tests(c, data, 180)
    # both sections took 98 + 210 s on an H100 (precision with fp32 packing): room for both
    rate = bench(c, a.rehearse, 420, a.bench) if "bench" in only else {}
    if "values" in only:
        k = a.runs_per_gpu or pick_k(rate, c.left() - TAR_S)
        values(c, data, k, device, a.runs or (a.out / "runs" if a.rehearse else RUNS_CUDA))
    failed = [n for n, r in c.results.items() if not r.get("ok")]
    print(f"\n{len(c.results) - len(failed)} of {len(c.results)} steps passed"
          f"{': failed ' + ', '.join(failed) if failed else ''}; {a.out / 'summary.txt'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
