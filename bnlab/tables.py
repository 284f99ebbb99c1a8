"""The experiments' tables and plots, regenerated from the runs' logs (never typed by hand).

    python -m bnlab.tables jitter|batch|ranks|all [--tag cifar10-5085]

Each table reads `experiments/<name>/sweep.yaml`, finds its runs under
`experiments/runs/<tag>/` and writes `experiments/<name>/table.md` and `<name>.png`.
The claims' verdicts (bnlab.verdicts) are written into experiments/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from bnlab import plots
from bnlab.analysis import MIN_EVALS, WINDOW
from bnlab.errors import BnlabError, run_cli
from bnlab.results import CellResult, budget_line, collect, fmt, run_minutes
from bnlab.sweep import ROOT, RUNS, Spec, load_spec
from bnlab.verdicts import NO_LEARNING, write_readme

EXPERIMENTS = ROOT / "experiments"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def provenance(cells: list[CellResult], tag: str, root: Path = RUNS) -> str:
    """Data, machine, commits and compute of the runs behind a table, read from the runs."""
    runs = [r for c in cells for r in c.runs]
    if not runs:
        return f"No finished runs yet under `experiments/runs/{tag}/`."
    commits = sorted({r.info.get("commit") or "?" for r in runs})
    hosts = json.loads((root / tag / "hosts.json").read_text()) \
        if (root / tag / "hosts.json").is_file() else {}
    machines = sorted({hosts.get(r.info.get("host"), r.info.get("host", "?")) for r in runs})
    devices = sorted({r.info.get("device", "?") for r in runs})
    torch_v = sorted({r.info.get("versions", {}).get("torch") or "?" for r in runs})
    expected = sum(c.expected for c in cells)
    return "\n".join([
        f"- Data: `{tag}` (CIFAR-10 training images read from the sweep's `--data`; "
        "validation on its test split)",
        f"- Machine: {'; '.join(machines)}; device {', '.join(devices)}; torch "
        f"{', '.join(torch_v)}",
        f"- Commit(s): {', '.join(f'`{c}`' for c in commits)}",
        f"- Runs: {len(runs)} of {expected} finished; summed run time "
        f"{run_minutes(runs):.1f} min (each run's sweep.json, all its launches; other work "
        "sometimes shared the cores)",
        f"- Wall time of this target: {budget_line(runs, expected, 'target')}",
    ])


SWING_NOTE = (f"Swing: half the peak-to-peak range of val acc over the evaluations in the last "
              f"{WINDOW:.0%} of training (at least {MIN_EVALS}), the claims' \"+/- points\"; step "
              "sd: standard deviation of successive differences there. Mean ± std over seeds; "
              "`-` where no seed finished or every seed diverged.")


def metric_cells(c: CellResult) -> list[str]:
    return [c.seeds_note(), c.stat("final").fmt(), c.stat("best").fmt(),
            c.stat("swing").fmt(), c.stat("step_sd").fmt(), c.stat("loss").fmt(2)]


METRIC_HEADER = ["seeds", "final val acc (%)", "best val acc (%)", "swing (± pts)",
                 "step sd (pts)", "final train loss"]


def jitter(spec: Spec, cells: list[CellResult], tag: str, out: Path) -> str:
    by_section: dict[str, list[CellResult]] = {}
    for c in cells:
        by_section.setdefault(c.cell.meta.get("section", "main"), []).append(c)
    titles = {"main": "4 ranks x 2 images, torchvision resnet18",
              "C4": "C4: augmentation off, and the reports' exact learning rate",
              "cifar_stem": "resnet18_cifar (3x3 stem, no max-pool)"}
    lines = []
    for sec in ("main", "C4", "cifar_stem"):
        rows = [[c.cell.label, *metric_cells(c)] for c in by_section.get(sec, [])]
        if sec == "main":
            pb = [c for c in by_section.get(sec, []) if c.stat("precise").n]
            extra = [f"- PreciseBN row, val acc after the last recalibration: "
                     f"{c.stat('precise').fmt()} (the row's val acc columns are the EMA "
                     "statistics' before it)" for c in pb]
        else:
            extra = []
        if rows:
            lines += [f"## {titles[sec]}", "", md_table(["row", *METRIC_HEADER], rows), "",
                    *extra, ""]
    ddp = by_section.get("ddp", [])
    if ddp:
        lines += ["## Simulation vs real DDP (4 gloo processes), seed 0", "",
                "The same cell re-run as 4 real processes for its first epoch; the simulation's "
                "run is the table's row. fp32 rounding differs between the two layouts, so the "
                "runs are expected to agree closely at first and then drift apart chaotically "
                "(see README, Simulated ranks).", "", ddp_table(ddp, cells), ""]
    lines += [ddpcheck_section(spec.path.parent / "ddpcheck.json"), SWING_NOTE, ""]
    plots.jitter(by_section, out / f"{spec.name}.png")
    return "\n".join(lines)


def ddpcheck_section(path: Path) -> str:
    """The step-by-step comparison that `python -m bnlab.ddpcheck` measured, if it did."""
    if not path.is_file():
        return ("The step-by-step comparison of the two layouts is not measured yet: "
                "`python -m bnlab.ddpcheck --data <dir>` (part of `make table-jitter`).\n")
    res = json.loads(path.read_text())
    return "\n".join([
        f"### The first {res['steps']} steps, parameter by parameter (seed {res['seed']})", "",
        f"`python -m bnlab.ddpcheck` trains each cell's first {res['steps']} steps as "
        f"{res['world']} gloo processes and as {res['world']} simulated ranks, and gives, "
        "after each step, ||real - simulated|| / ||simulated - initial|| over all parameters: "
        "how far apart the layouts are as a fraction of how far training moved the weights. "
        "The control trains the simulation again from weights changed by 1 part in 10^15: "
        "where the layouts drift apart no faster than the control, the drift is the cell's "
        f"own sensitivity to rounding, not a difference between them. Measured in "
        f"{res['measure_s']:.0f} s.", "", ddpcheck_table(res), ""])


def ddpcheck_table(res: dict) -> str:
    steps = list(next(iter(next(iter(res["cells"].values())).values())))
    rows = [[name, what, *(f"{diffs[s]:.1e}" for s in steps)]
            for name, by in res["cells"].items() for what, diffs in by.items()]
    return md_table(["cell", "compared", *(f"step {s}" for s in steps)], rows)


def ddp_table(ddp: list[CellResult], cells: list[CellResult]) -> str:
    by_label = {c.cell.label: c for c in cells}
    rows = []
    for c in ddp:
        sim = by_label.get(c.cell.meta["compare"])
        real_run = c.runs[0] if c.runs else None
        sim_run = next((r for r in (sim.runs if sim else []) if r.seed == 0), None)
        if real_run is None or sim_run is None:
            rows.append([c.cell.label, "not run yet", "", "", "", ""])
            continue
        stop = real_run.last("step")
        sim_loss = {r["step"]: r["train/loss"] for r in sim_run.rows
                    if "train/loss" in r and r["step"] <= stop}
        real_loss = {r["step"]: r["train/loss"] for r in real_run.rows if "train/loss" in r}
        common = sorted(set(sim_loss) & set(real_loss))
        first = common[0]
        diffs = [abs(sim_loss[s] - real_loss[s]) for s in common]
        sim_acc = [a for e, a in zip(sim_run.epochs, sim_run.accs, strict=True)
                   if e <= real_run.epochs[-1] + 1e-9]
        rows.append([c.cell.label, str(stop),
                     f"{sim_loss[first]:.4f} / {real_loss[first]:.4f}",
                     f"{max(diffs):.3f}",
                     " ".join(fmt(a) for a in sim_acc) + " / "
                     + " ".join(fmt(a) for a in real_run.accs),
                     f"{sim_acc[-1] - real_run.accs[-1]:+.1f}" if sim_acc else "-"])
    return md_table(["cell", "steps", "train loss at first log, sim / real",
                     "max abs loss diff over logs", "val acc at each eval, sim / real",
                     "last val acc diff (pts)"], rows)


def batch(spec: Spec, cells: list[CellResult], tag: str, out: Path) -> str:
    cols = sorted({c.cell.meta["col"] for c in cells}, reverse=True)
    rows_ = list(dict.fromkeys(c.cell.meta["row"] for c in cells))
    grid = {(c.cell.meta["row"], c.cell.meta["col"]): c for c in cells}
    ref = spec.extra.get("reference", {})

    def err(c: CellResult) -> str:
        s = c.stat("final")
        return "-" if s.mean is None else \
            f"{100 - s.mean:.1f}" + (f" ± {s.std:.1f}" if s.std is not None else "")

    def line(name: str, r: str, text: Callable[[CellResult], str]) -> list[str]:
        """One row of the grid; `n/a` where the spec has no cell (a row run at some sizes)."""
        return [name, *(text(grid[r, b]) if (r, b) in grid else "n/a" for b in cols)]

    header = ["images per rank", *map(str, cols)]
    body = [line(f"{r} (ours, val error %)", r, err) for r in rows_]
    body += [[f"{r} ({ref['source'].split(',')[0]}, ImageNet)",
              *(fmt(ref[r].get(b)) for b in cols)] for r in rows_ if r in ref]
    acc = [line(f"{r} val acc (%)", r, lambda c: c.stat("final").fmt()) for r in rows_]
    sw = [line(f"{r} swing (± pts)", r, lambda c: c.stat("swing").fmt()) for r in rows_]
    seeds = [line(f"{r} seeds", r, CellResult.seeds_note) for r in rows_]
    steps = [["optimizer steps (from the logs)", *(steps_of(grid, rows_, b) for b in cols)]]
    plots.batch(rows_, cols, grid, ref, out / f"{spec.name}.png")
    lr = ", ".join(f"{b}: {grid[rows_[0], b].cell.cfg['optim']['lr']:g}" for b in cols)
    return "\n".join([
        "## Val error (%) by images per rank, as in the GroupNorm paper's table", "",
        md_table(header, body), "",
        f"Ours: CIFAR-10 (`{tag}`), torchvision resnet18, 4 ranks, 5 epochs, final val error = "
        f"100 - final val acc, mean ± std over seeds. Learning rate by images per rank ({lr}): "
        "0.1 x global batch / 64. The paper's rows are ResNet-50 on ImageNet, quoted for the "
        "shape only." + (f" {spec.extra['note']}" if spec.extra.get("note") else ""), "",
        "## Val acc, swing and seeds", "", md_table(header, acc + sw + seeds + steps), "",
        "Every cell trains 5 epochs, so more images per rank means fewer optimizer steps; "
        "compare the rows within a column. A row's final val acc under "
        f"{NO_LEARNING:g}% means the run did not learn (see its train loss in "
        "metrics.jsonl), which L1's verdict leaves out.", "",
        SWING_NOTE, ""])


def steps_of(grid: dict, rows: list[str], col: int) -> str:
    """The optimizer steps the column's runs took, read from their last logged step."""
    n = {r.last("step") for row in rows if (row, col) in grid for r in grid[row, col].runs}
    return "-" if not n else "/".join(str(x) for x in sorted(n))


def ranks(spec: Spec, cells: list[CellResult], tag: str, out: Path) -> str:
    rows = []
    for c in cells:
        cfg = c.cell.cfg
        rows.append([c.cell.label, str(c.cell.meta["global"]), str(cfg["batch_per_gpu"]),
                     str(cfg["grad_accum"]), f"{cfg['optim']['lr']:g}", *metric_cells(c)])
    plots.curves(cells, out / f"{spec.name}.png",
                 "Same global batch, same data order: val accuracy (mean and range over seeds)")
    return "\n".join([
        md_table(["layout", "global batch", "BN batch (images per rank)", "grad_accum", "lr",
                  *METRIC_HEADER], rows), "",
        "Pairs share the global batch, the learning rate and the order of the images (the "
        "sampler is layout-independent): 1x8 with 4x2, and 4x2 + grad_accum 4 with 4x8. "
        "Gradient accumulation enlarges the optimizer's batch, not the batch BN normalizes "
        "over.", "", SWING_NOTE, ""])


TABLES: dict[str, Callable[[Spec, list[CellResult], str, Path], str]] = {
    "jitter": jitter, "batch": batch, "ranks": ranks}


def default_tag() -> str:
    tags = sorted(p.name for p in RUNS.iterdir() if p.is_dir()) if RUNS.is_dir() else []
    if len(tags) != 1:
        raise BnlabError(f"experiments/runs holds {len(tags)} data tags ({', '.join(tags)}); "
                         "pick one with --tag.")
    return tags[0]


def build(name: str, tag: str, root: Path = RUNS, out: Path | None = None
          ) -> dict[str, CellResult]:
    """Write experiments/<name>/table.md and <name>.png (or into `out`) from the runs."""
    spec = load_spec(EXPERIMENTS / name / "sweep.yaml")
    out = out or EXPERIMENTS / name
    out.mkdir(parents=True, exist_ok=True)
    cells = collect(spec, tag, root)
    body = TABLES[name](spec, cells, tag, out)
    text = "\n".join([f"# {spec.title}", "",
                      f"Generated by `python -m bnlab.tables {name}` (`make table-{name}` runs "
                      "the sweep first) from the runs' logs; do not edit.", "",
                      provenance(cells, tag, root), "", body, f"![{name}]({name}.png)", ""])
    (out / "table.md").write_text(text)
    print(f"wrote {out / 'table.md'} and {out / f'{name}.png'}")
    return {c.cell.label: c for c in cells}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="+", choices=[*TABLES, "all"])
    p.add_argument("--tag", help="data tag: a folder of experiments/runs (default: the only one)")
    a = p.parse_args(argv)
    names = list(TABLES) if "all" in a.names else a.names

    def body() -> None:
        tag = a.tag or default_tag()
        results = {n: build(n, tag) for n in names}
        if set(TABLES) <= set(results):
            write_readme(results, tag, EXPERIMENTS / "README.md")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
