"""The jitter table's measurement: real DDP against the simulation on its key cells, step by
step (`make table-jitter` runs it; the table shows it).

    python -m bnlab.claims.ddpcheck [--data DIR] [--steps 20] [--out experiments/jitter]

For bn and syncbn at 4 ranks x 2 images (the jitter spec's own cells, seed 0, on the real
data), trains the first `--steps` optimizer steps twice, as 4 gloo processes and as
`dist.simulate=4` in one process, with the trainer's own pieces (build_net, wrap,
TrainLoader, build_optimizer, train_step), once in float64 and once in float32. Rank 0 holds
both and records, after each step, how far apart their parameters are as a fraction of how far
training has moved them.
A control trains the float64 simulation again with every initial weight scaled by
1 + 1e-15: where the layouts' difference grows as fast as the control's, the growth is the
cell's own sensitivity to rounding, not a difference between the layouts. Writes
`ddpcheck.json` beside the jitter table, which shows it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bnlab.cli import run_cli
from bnlab.errors import BnlabError
from bnlab.lab.page import md_table
from bnlab.lab.table import save_results
from bnlab.paths import EXPERIMENTS

OUT = EXPERIMENTS / "jitter"
SAVED = "ddpcheck.json"
STEPS = 20  # optimizer steps compared
CELLS = ("bn", "syncbn")
WORLD = 4
NUDGE = 1e-15  # the control's change to every initial weight (float64 resolves 2.2e-16)


def record_steps(steps: int) -> list[int]:
    """The steps after which the difference is recorded: 1, 2, 3, 5, 10, 20, 30, ..."""
    marks = [1, 2, 3, 5] + list(range(10, steps + 1, 10))
    return [s for s in marks if s <= steps] + ([steps] if steps not in marks else [])


def _params(model) -> dict:
    return {k: p.detach().clone() for k, p in model.named_parameters()}


def _train(cfg: dict, data, env, dtype, steps: int, nudge: float = 0.0) -> dict[int, dict]:
    """Rank 0's parameters after each recorded step, training as the trainer does (with
    `nudge`, every initial weight first scaled by 1 + nudge)."""
    import torch

    from bnlab.dist import world_size
    from bnlab.metrics import Meter
    from bnlab.net import build_net
    from bnlab.optim import build_optimizer
    from bnlab.trainer import train_loader, train_step, wrap

    model = build_net(cfg).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + nudge)
    net = wrap(model, cfg, env)
    loader = train_loader(cfg, data, env)
    opt, sched = build_optimizer(cfg["optim"], model, loader.steps_per_epoch, cfg["epochs"])
    meter, keep = Meter(env.device), set(record_steps(steps))
    out = {0: _params(model)} if env.rank == 0 else {}
    for step, micro in enumerate(loader.epoch(0), start=1):
        micro = [(x.to(dtype), y) for x, y in micro]
        train_step(net, micro, opt, meter, sync_grads=world_size(cfg, env.world) > 1)
        sched.step()
        if step in keep and env.rank == 0:
            out[step] = _params(model)
        if step == steps:
            break
    return out


def difference(a: dict, b: dict, start: dict) -> float:
    """||a - b|| / ||b - start|| over all parameters together: how far apart the two layouts
    are, as a fraction of how far training has moved the weights (1 = as far apart as
    trained)."""
    import torch

    gap = torch.sqrt(sum(((a[k] - b[k]).double() ** 2).sum() for k in b))
    moved = torch.sqrt(sum(((b[k] - start[k]).double() ** 2).sum() for k in b))
    return float(gap / moved.clamp_min(1e-300))


def _worker(cfgs: dict, data_root: str, steps: int) -> dict | None:
    import torch

    from bnlab import dist
    from bnlab.data import build_dataset

    env = dist.init("cpu", "gloo", timeout_s=600, threads=1)
    result: dict = {}
    datasets: dict[str, object] = {}  # the cells share their data: read it once
    for name, cfg in cfgs.items():
        key = json.dumps(cfg["data"], sort_keys=True)
        if key not in datasets:
            datasets[key] = build_dataset({**cfg["data"], "root": data_root, "download": False})
        data = datasets[key]
        for dtype in (torch.float64, torch.float32):
            real = _train({**cfg, "dist": {**cfg["dist"], "simulate": 1}}, data, env, dtype,
                          steps)
            if env.rank == 0:  # the simulation on rank 0, while the others wait
                local = dist.DistEnv(0, 1, 0, env.device, None)
                sim = _train(cfg, data, local, dtype, steps)
                row = result.setdefault(name, {})
                row[f"{str(dtype).removeprefix('torch.')}, real vs simulated"] = {
                    str(s): difference(real[s], sim[s], sim[0]) for s in sorted(real) if s}
                if dtype == torch.float64:  # the control: the simulation against itself
                    nudged = _train(cfg, data, local, dtype, steps, NUDGE)
                    row[f"float64, simulated vs itself with weights x (1 + {NUDGE:g})"] = {
                        str(s): difference(nudged[s], sim[s], sim[0]) for s in sorted(sim) if s}
            dist.barrier()
    dist.teardown()
    return result if env.rank == 0 else None


def measure(data_root: str | None, steps: int) -> dict:
    """`data_root` None: the cells' own data.root (downloaded when missing, as train.py)."""
    from bnlab.data import ensure_cifar10
    from bnlab.dist import launch_local
    from bnlab.lab.spec import load_spec

    spec = load_spec(OUT / "sweep.yaml")
    cells = {c.label: c for c in spec.cells}
    cfgs = {}
    for name in CELLS:
        cfg = json.loads(json.dumps(cells[name].cfg))
        if cfg["dist"]["simulate"] != WORLD or cfg["dist"]["nproc_per_node"] != 1:
            raise BnlabError(f"the jitter cell `{name}` is no longer {WORLD} simulated ranks; "
                             "update bnlab/claims/ddpcheck.py with the spec.")
        cfg["seed"] = 0
        cfgs[name] = cfg
    # As the sweep: a folder given with --data is read as is; the default may download.
    download = data_root is None
    data_root = data_root or cfgs["bn"]["data"]["root"]
    ensure_cifar10(Path(data_root), download=download)
    t0 = time.perf_counter()
    res = launch_local(_worker, WORLD, cfgs, data_root, steps)[0]
    return {"world": WORLD, "batch_per_gpu": cfgs["bn"]["batch_per_gpu"], "steps": steps,
            "seed": 0, "cells": res, "measure_s": round(time.perf_counter() - t0, 1)}


def section(path: Path) -> str:
    """The jitter table's section: the comparison this module measured, if it did."""
    if not path.is_file():
        return ("The step-by-step comparison of the two layouts is not measured yet: "
                "`python -m bnlab.claims.ddpcheck --data <dir>` (part of `make table-jitter`).\n")
    res = json.loads(path.read_text())
    return "\n".join([
        f"### The first {res['steps']} steps, parameter by parameter (seed {res['seed']})", "",
        f"`python -m bnlab.claims.ddpcheck` trains each cell's first {res['steps']} steps as "
        f"{res['world']} gloo processes and as {res['world']} simulated ranks, and gives, "
        "after each step, ||real - simulated|| / ||simulated - initial|| over all parameters: "
        "how far apart the layouts are as a fraction of how far training moved the weights. "
        "The control trains the simulation again from weights changed by 1 part in 10^15: "
        "where the layouts drift apart no faster than the control, the drift is the cell's "
        "own sensitivity to rounding, not a difference between them. Measured in "
        f"{res['measure_s']:.0f} s.", "", table(res), ""])


def table(res: dict) -> str:
    steps = list(next(iter(next(iter(res["cells"].values())).values())))
    rows = [[name, what, *(f"{diffs[s]:.1e}" for s in steps)]
            for name, by in res["cells"].items() for what, diffs in by.items()]
    return md_table(["cell", "compared", *(f"step {s}" for s in steps)], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="folder holding cifar-10-batches-py (default: data.root)")
    p.add_argument("--steps", type=int, default=STEPS, help="optimizer steps to compare")
    p.add_argument("--out", type=Path, default=OUT, help="where ddpcheck.json goes")

    def body() -> None:
        a = p.parse_args(argv)
        if a.steps < 1:
            raise BnlabError("--steps must be 1 or more.")
        res = measure(a.data, a.steps)
        save_results(a.out / SAVED, res)
        print(table(res))
        print(f"wrote {a.out / SAVED} ({res['measure_s']} s)")

    return run_cli(body)


if __name__ == "__main__":
    raise SystemExit(main())
