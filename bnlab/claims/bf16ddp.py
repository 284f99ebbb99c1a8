"""`make table-bf16ddp`: table-values' CUDA bf16 cell (resnet18 at 32 px, 4 ranks x 2 images,
bf16 autocast: it diverged on every seed, under the simulation of ranks) re-run on this CPU by
the simulation and by real 4-process gloo DDP, each seed's divergence step side by side, by
experiments/bf16ddp/rules.yaml (written before any of its runs):

    python -m bnlab.claims bf16ddp --data DIR     # its runs, then the table
    python -m bnlab.claims bf16ddp --report       # the table from the runs' logs

Under bf16 the simulation is not DDP to the bit (one convolution over every simulated rank's
images rounds its weight gradient otherwise than DDP's average of per-rank gradients:
docs/training.md); this table says whether the divergence is real DDP's too. table-values'
bf16 row reads `by_seed()`. Writes experiments/bf16ddp/{table.md, bf16ddp.png}.
"""

from __future__ import annotations

import json
from pathlib import Path

from bnlab.lab import page, rules, table
from bnlab.lab.figures import nothing_yet, plt, save
from bnlab.lab.results import Run
from bnlab.lab.table import RunsData, Verdict
from bnlab.paths import RUNS_CUDA
from bnlab.rundir import read_status_full

RULES = rules.read("bf16ddp")
CAP = RULES["cap_steps"]
BY = ("simulated", "real")  # the cells' `by`
CUDA_CELL = {"model=resnet18", "dist.simulate=4", "batch_per_gpu=2", "precision=bf16"}


def divergence(run: Run | None) -> int | str | None:
    """The step at which the trainer stopped `run` as diverged; "none" where it trained to
    the cap without diverging; None while it is to come (not ended)."""
    if run is None:
        return None
    if run.status == "diverged":
        step = (read_status_full(run.path) or {}).get("step")
        return step if step is not None else next(
            (r["step"] for r in reversed(run.rows) if "step" in r), "at an unknown step")
    return "none" if run.status == "completed" else None


def cuda_steps(root: Path = RUNS_CUDA) -> dict[int, int | str | None]:
    """The CUDA runs' divergence step by seed (table-values' bf16 cell at 4 x 2)."""
    out = {}
    for info in sorted(root.glob("*/resnet18-bn-4x2-*/seed*/run.json")):
        if set(json.loads(info.read_text()).get("overrides", [])) >= CUDA_CELL:
            seed = int(info.parent.name.removeprefix("seed"))
            out[seed] = divergence(Run.read(info.parent, seed))
    return out


def runs_of(d: RunsData, by: str) -> dict[int, Run]:
    c = next((c for c in d.cells if c.cell.meta["by"] == by), None)
    return {r.seed: r for r in (c.runs if c else [])}


def agree(sim: int | str | None, real: int | str | None) -> str:
    """rules `agree`: agree, disagree or to come."""
    if sim is None or real is None:
        return "to come"
    return "agree" if (sim == "none") == (real == "none") else "disagree"


def by_seed(d: RunsData, cuda: dict[int, int | str] | None = None) -> list[dict]:
    """Per seed: {seed, cuda, simulated, real, agree, holds} (steps, "none" or None)."""
    cuda = cuda_steps() if cuda is None else cuda
    sim, real = runs_of(d, "simulated"), runs_of(d, "real")
    out = []
    for s in sorted(set(cuda) | {s for c in d.cells for s in c.cell.seeds}):
        a, b = divergence(sim.get(s)), divergence(real.get(s))
        out.append({"seed": s, "cuda": cuda.get(s), "simulated": a, "real": b,
                    "agree": agree(a, b),
                    "holds": None if b is None else b != "none"})  # rules `holds`
    return out


def cross_check(runs: Path, tag: str, cuda: Path) -> str:
    """For table-values' bf16 row: each seed's divergence under real gloo DDP on the CPU, from
    this table's runs under `runs` (the folder of run folders by data tag, at `tag`), beside
    the simulation's there, the CUDA runs read from `cuda`; where real DDP trains to the cap,
    that seed's divergence is the simulation's (rules `holds`)."""
    d = table.runs_data(table.Context(TABLE, runs=runs, tag=tag))
    each = [f"seed {r['seed']} {said(r['real'])}" + (
        f" (the CPU simulation: {said(r['simulated']).removeprefix('diverged ')})"
        if r["simulated"] is not None else "") + (
        ": its divergence is the simulation's, not DDP's" if r["holds"] is False else "")
        for r in by_seed(d, cuda_steps(cuda))]
    return f"real gloo DDP on a CPU (make table-bf16ddp): {', '.join(each)}"


def said(step: int | str | None, cap: str = f"in {CAP:,} steps") -> str:
    """'diverged at step 450', 'no divergence in 2,000 steps' (`cap`: the run's length), or
    'to come'."""
    if step is None:
        return "to come"
    if step == "none":
        return f"no divergence {cap}"
    return f"diverged at step {step:,}" if isinstance(step, int) else f"diverged {step}"


def render(d: RunsData) -> str:
    rows = [[str(r["seed"]), said(r["cuda"], "in its 10 epochs"), said(r["simulated"]),
             said(r["real"]),
             f"agree ({abs(r['real'] - r['simulated']):,} steps apart)" if r["agree"] == "agree"
             and all(isinstance(r[k], int) for k in BY) else r["agree"],
             "to come" if r["holds"] is None else "yes" if r["holds"] else
             "no: the simulation's"] for r in by_seed(d)]
    words = [f"**{k}**: {' '.join(RULES.raw[k].split())}" for k in ("measure", "agree", "holds")]
    return table.runs_page(d, "\n".join([
        "resnet18 at 32 px, bn, 4 ranks x 2 images, lr 0.00625, bf16 autocast (table-values' "
        f"cell), each run stopped at {CAP:,} steps. The H100 column is table-values' run "
        "(the simulation of ranks on CUDA, experiments/runs-cuda); the CPU columns' machines and "
        "kernels are listed above.", "",
        page.md_table(["seed", "H100, simulated", "CPU, simulated",
                       "CPU, real gloo DDP", "real DDP against the simulation",
                       "the divergence holds under real DDP"], rows), "",
        "## The rules", "", *[w + "\n" for w in words], *rules.history(RULES), ""]))


def plot(d: RunsData, path: Path) -> None:
    seeds = [r["seed"] for r in by_seed(d)]
    fig, axes = plt.subplots(1, max(len(seeds), 1), figsize=(4 * max(len(seeds), 1), 3.2),
                             squeeze=False)
    cuda = cuda_steps()
    for ax, s in zip(axes[0], seeds, strict=False):
        drawn = False
        for i, by in enumerate(BY):
            run = runs_of(d, by).get(s)
            if run is not None:
                xs, ys = run.series("train/loss", by="step")
                ax.plot(xs, ys, color=f"C{i}", lw=1, label=f"{by} (CPU)")
                drawn = drawn or bool(xs)
        if isinstance(cuda.get(s), int):
            ax.axvline(cuda[s], color="C3", ls="--", lw=1, label="H100 (simulated) diverged")
        if not drawn:
            nothing_yet(ax, "runs still to come")
        ax.set(title=f"seed {s}", xlabel="step", ylabel="train loss", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, path, "bf16 at 4 x 2: train loss until divergence, simulated against real DDP")


def verdicts(d: RunsData) -> list[Verdict]:
    return []  # no claim of CLAIMS.md: table-values' bf16 row reads by_seed()


TABLE = table.Table("bf16ddp", (), table.runs_data, render, verdicts, plot, block="bf16ddp")
