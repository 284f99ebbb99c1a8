"""docs/performance.md from the benchmark's JSON results and the sweeps' own run records.

    uv run python benchmarks/perfdoc.py [RESULTS.json ...] [--out docs/performance.md]

Every figure on the page comes from those files; the prose only explains. One section per
results file (one machine each): figures from different machines never share a ratio.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from bnlab.lab.results import read_hosts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNS, RUNS_CUDA = ROOT / "experiments" / "runs", ROOT / "experiments" / "runs-cuda"

WHY = {
    "overhead": "The trainer's loop adds to a bare loop: the layout-independent loader "
                "(index, gather, augment, normalize), the device-side meters, the LR "
                "scheduler and a metrics line every `log_every` steps.",
    "data": "The loader reads the epoch's permutation and draws, gathers the images from "
            "memory and augments them in one batched gather.",
    "sim": "The simulation runs the 4 ranks' work as one batch through one process: no "
           "inter-process communication, no per-process copies of the model, and larger "
           "kernels. The equality with real DDP is tested in float64 "
           "(tests/test_simulate.py).",
    "syncbn": "SyncBN adds, per BN layer (20 in resnet18), one all_gather of the per-rank "
              "(count, mean, M2) in the forward and one all_reduce of two gradient sums in the "
              "backward: about 40 small blocking collectives per step, each waiting for the "
              "slowest rank, which cannot overlap with computation because the next layer "
              "needs their result. The row without collectives (replaced by local copies) "
              "splits the cost into SyncBN's own arithmetic (a Python autograd function "
              "instead of torch's fused kernel) and communication. On this machine the "
              "processes also share 2 cores, so every wait costs a context switch. The "
              "practitioners' 1.15-1.17x is for GPUs with NCCL.",
    "precisebn": "One forward pass over the images, no backward; per channel, pooled E[x] "
                 "and E[x^2] in float64 (the train estimator, as the trainer runs it). The "
                 "epoch it is compared with is the table-jitter cell's 635 steps at the "
                 "measured simulated step time.",
    "fixes": "table-recover's fixes at its cell (resnet20, 4 ranks x 2 simulated in one "
             "process, on CPU), each against bn in alternating rounds: what each costs a step "
             "beyond bn's arithmetic. In one process syncbn's and its groups' collectives are "
             "local (the syncbn section has real gloo processes); on a GPU with NCCL the "
             "ranking may differ.",
    "eval": "Eval mode, no gradients, the validation set sharded across ranks.",
    "threads": "Steps of the table-jitter cell (resnet18, 4 simulated ranks x 2 images) with "
               "one or more runs side by side on the cores.",
    "sweep": "Runs per hour of the table-jitter cell (5 epochs: 3,175 steps and 25 "
             "evaluations), estimated from the measured step and evaluation times.",
    "compile": "torch.compile (inductor, CPU) of the bare loop's model; the first step "
               "includes compilation (inductor caches compiled code between runs, so it is "
               "shorter when an earlier run compiled the same model).",
    "channels_last": "NHWC memory format for the model and its inputs (bare loop). The "
                     "table-jitter cell's steps are 8 images; the batch table's largest "
                     "cells are 128.",
    "preempt": "In real DDP the ranks agree on a pending SIGTERM/SIGUSR1/SIGUSR2 with a 1-element "
               "max all-reduce (a collective and a host sync), so all ranks checkpoint at the "
               "same step. It runs at every step; on CPU its cost is within the noise, and "
               "whether a sparser check pays on a GPU (where it is a host sync) is unmeasured.",
    "gpu": "Measured only where a CUDA device is visible (`make gpu-check`, or `make "
           "test-gpu`); each row names "
           "the GPU, and the machine line above names the host. Steps are timed with the "
           "device synchronised before each clock reading. The SyncBN rows time one layer's "
           "forward and backward through a one-rank NCCL group: the implementations' own "
           "arithmetic and one all_gather, with no other rank to wait for.",
    "precision": "Each training step (the trainer's train_step, as a run takes it) in bf16 "
                 "autocast and with channels-last weights and images, against fp32 with "
                 "contiguous tensors, on the device the row names: resnet20 and torchvision "
                 "resnet18 at 32 px, at 4 simulated ranks x 2 (syncbn: the recovered cell) and "
                 "1 x 8 (bn), the four variants in alternating rounds in one run. At 8 images "
                 "a step is a few dozen small kernels, so casts can cost more than bf16 saves; "
                 "the packing section's rows from the same run repeat the headline cell in fp32 "
                 "and bf16 with K runs on one GPU.",
    "packing": "K runs of the headline cell (resnet20, 4 simulated ranks x 2 images) side by "
               "side on one GPU (`python -m bnlab.claims ... --runs-per-gpu K --jobs K`), each "
               "its own process with cores / K threads, all starting together; step times "
               "measured while all K train, evaluation times after (a lower bound beside K "
               "runs), runs per hour computed from them for a 20-epoch run.",
    "report": "Before `make report` computes a table it composes every cell of its sweep spec "
              "(as train.py would, to find each run's folder) and reads every run's "
              "config.yaml. Compositions are kept under ~/.cache/bnlab/composed "
              "(docs/sweeps.md; BNLAB_CACHE=off turns it off), keyed on the overrides, every "
              "file under configs/ and the Hydra packages' versions, so only a changed config "
              "composes again.",
}


# Options measured against the default: the page says, from the figures, where each pays.
OPTIONS = {"compile": "eager", "channels_last": "the default memory format"}


SWITCH = {"compile": "train.py compile=true", "channels_last": "train.py channels_last=true"}


def option_verdict(name: str, rows: list[dict]) -> str:
    """'Faster ...' / 'slower ...' per measured setting, and the switch that turns it on (off
    by default: it pays only where it is faster)."""
    parts = [f"{'faster' if r['ratio'] < 1 else 'slower'} than {OPTIONS[name]} for "
             f"{r['what'].split(', ', 1)[-1]} ({r['ratio']:.2f}x)" for r in rows if r["ratio"]]
    if not parts:
        return ""
    return ("Measured: " + "; ".join(parts) + f". Off by default; {SWITCH[name]} turns it on: "
            + ("it did not pay at any measured setting." if all(r["ratio"] >= 1 for r in rows
                                                                   if r["ratio"])
               else "it pays only at the settings where it is faster."))


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def section(res: dict) -> list[str]:
    m = res["machine"]
    out = [f"## {m['machine']}", "", f"Host `{m['host']}`, Python {m['python']}, torch "
           f"{m['torch']}. Measured by:", ""]
    for run in res["runs"]:
        quick = " **(quick: code paths only, figures not meaningful)**" if run["quick"] else ""
        out.append(f"- run {run['id']}: `{run['command'].strip()}` at commit "
                   f"`{run['commit'][:10]}`, {run['date']}, {run['wall_s'] / 60:.1f} min "
                   f"({', '.join(run['sections'])}){quick}")
    out.append("")
    targets = [r for r in res["rows"] if r["target"]]
    if targets:
        out += ["### Targets", "", "| figure | measured | against | ratio | target | met |",
                "|---|---|---|---|---|---|"]
        for r in targets:
            ratio = r["ratio"]
            shown = f"{100 * ratio:.2f}%" if r["section"] == "data" else f"{ratio:.2f}x"
            out.append(f"| {r['what']} | {_fmt(r['value'])} {r['unit']} | {r['ref_what']} "
                       f"({_fmt(r['ref'])}) | {shown} | {r['target']} | "
                       f"{'yes' if r['met'] else '**no**'} |")
        out.append("")
        missed = [r for r in targets if not r["met"]]
        if missed:
            out += ["Missed: " + "; ".join(f"{r['what']} ({r['ratio']:.2f}x against "
                                           f"{r['target']})" for r in missed)
                    + ". Why: see the section of each below.", ""]
    for name in dict.fromkeys(r["section"] for r in res["rows"]):
        rows = [r for r in res["rows"] if r["section"] == name]
        if not rows:
            continue
        out += [f"### {name}", "", WHY.get(name, ""), ""]
        if name in OPTIONS:
            out += [option_verdict(name, rows), ""]
        runs = sorted({r.get("run", 0) for r in rows})
        if len(runs) > 1:  # a section measured by several runs: ratios only within one run
            out += [f"Rows from runs {', '.join(map(str, runs))} (the run column): each ratio "
                    "is within its run; across runs the machine's load may differ.", ""]
        run_col = len(runs) > 1
        out += ["| figure | measured | against | ratio | note |" + (" run |" if run_col else ""),
                "|---|---|---|---|---|" + ("---|" if run_col else "")]
        for r in rows:
            against = f"{r['ref_what']} ({_fmt(r['ref'])})" if r["ref"] else ""
            ratio = f"{r['ratio']:.3f}x" if r["ratio"] else ""
            out.append(f"| {r['what']} | {_fmt(r['value'])} {r['unit']} | {against} | "
                       f"{ratio} | {r['note']} |" + (f" {r.get('run', 0)} |" if run_col else ""))
        out.append("")
    return out


def _jobs_then(run: Path, threads: int) -> int | None:
    """Jobs side by side for a record that predates `jobs` in sweep.json: the sweep gave each
    job cores // jobs threads, and hosts.json names the host's cores (None where the machines
    seen under that host name differ in cores)."""
    host = json.loads((run / "run.json").read_text())["host"]
    cores = {int(re.search(r"(\d+) cores", m).group(1))
             for m in read_hosts(run.parent.parent).get(host, [])}
    return max(1, cores.pop() // threads) if len(cores) == 1 else None


ON_CPU = ("Observed: the sweeps' own runs", "Other work often shared the cores with these "
          "sweeps, so they are slower than the benchmark's estimate, which measures a quiet "
          "machine.")
ON_GPU = ("Observed on a GPU: the values runs of `make gpu-check`", "Runs side by side on one "
          "GPU (`--runs-per-gpu`, the jobs column), 10 epochs each: half a headline run; the "
          "runs its time limit stopped are left out.")


def observed_sweeps(runs: Path = RUNS, words: tuple[str, str] = ON_CPU) -> list[str]:
    """Wall time of the committed sweep runs, from their sweep.json, by cell kind."""
    groups: dict[tuple, list[float]] = {}
    for f in sorted(runs.glob("*/*/seed*/sweep.json")):
        rec = json.loads(f.read_text())
        if rec.get("rc") != 0 or rec.get("launches", 1) > 1:
            continue
        cell = f"{rec['cell']} ({f.parent.parent.name.rsplit('-', 1)[0]})"
        jobs = rec.get("jobs") or _jobs_then(f.parent, rec["threads"])
        if jobs is None:
            continue
        groups.setdefault((cell, rec.get("threads"), jobs), []).append(rec["wall_s"])
    if not groups:
        return []
    shown = runs.relative_to(ROOT) if runs.is_relative_to(ROOT) else runs
    out = [f"## {words[0]}", "",
           "Wall time per completed run, from each run's `sweep.json` under "
           f"`{shown}` (runs resumed after a stop left out). {words[1]}", "",
           "| cell (model-norm-ranks x images) | threads per job | runs | median wall | range | "
           "jobs side by side | runs/hour |", "|---|---|---|---|---|---|---|"]
    for (cell, threads, jobs), walls in sorted(groups.items()):
        med = statistics.median(walls)
        out.append(f"| {cell} | {threads} | {len(walls)} | {med:.0f} s | "
                   f"{min(walls):.0f}-{max(walls):.0f} s | {jobs} | {jobs * 3600 / med:.1f} |")
    return out + [""]


def render(results: list[dict]) -> str:
    lines = ["# Performance", "",
             "Generated by `python benchmarks/perfdoc.py` from the JSON that "
             "`make bench` (`benchmarks/bench.py`) writes under `benchmarks/results/`; do not "
             "edit by hand. Each ratio compares two figures measured side by side in one run "
             "on one machine. Times are medians over steps after warm-up.", ""]
    for res in results:
        lines += section(res)
    if all("no GPU" in r["machine"]["machine"] for r in results):
        lines += ["No GPU figures yet: no session that produced these results had a GPU.", ""]
    lines += observed_sweeps(RUNS) + observed_sweeps(RUNS_CUDA, ON_GPU)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="*", type=Path)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md")
    a = p.parse_args()
    files = a.results or sorted((HERE / "results").glob("*.json"))
    if not files:
        print("perfdoc: error: no benchmark results; run `make bench` first.", file=sys.stderr)
        return 2
    results = [json.loads(f.read_text()) for f in files]
    a.out.write_text(render(results))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
