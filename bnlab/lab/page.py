"""The lines of a table's page (table.md): markdown tables, where its runs come from
(provenance), their wall time, seeds, and the metric columns the short-protocol tables share.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import yaml

from bnlab import floatenv
from bnlab.jitter import MIN_EVALS, WINDOW
from bnlab.lab.results import (
    CellResult,
    Run,
    read_hosts,
    run_minutes,
    wall_minutes,
)
from bnlab.paths import CONFIGS, RUNS, shown


def default_rate(images: int = 8) -> float:
    """The default rate at `images` per optimizer step (4 x 2: 8), as configs/optim/sgd.yaml
    scales it: 0.00625 at 8."""
    sgd = yaml.safe_load((CONFIGS / "optim" / "sgd.yaml").read_text())
    return sgd["lr"] * images / sgd["scale_from"]


def rate(lr: float) -> str:
    """A rate as a reader places it: 'lr 0.00039 (1/16 of the default)', the default being
    the rate at 4 x 2 (default_rate)."""
    times = lr / default_rate()
    share = ("the default" if abs(times - 1) < 1e-9 else
             f"1/{1 / times:g} of the default" if times < 1 else f"{times:g}x the default")
    return f"lr {short(lr)} ({share})"


def short(lr: float) -> str:
    """A rate in at most 7 characters: 0.00625, 0.0125, and 0.0016, 0.00039 where longer."""
    return f"{lr:g}" if len(f"{lr:g}") <= 7 else f"{lr:.2g}"


def model(cells: list[CellResult]) -> str:
    """The model the cells train, as a finding names it ('resnet20'; several joined)."""
    names = sorted({c.cell.cfg.get("model", {}).get("name", "") for c in cells} - {""})
    return " and ".join(names) or "the model"


def listed(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c': names in a sentence."""
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def run_machines(run: Run, hosts: dict[str, list[str]]) -> list[str]:
    """The machines a run trained on, at its start and at each resume: named in its run.json,
    or, where an older entry names only its host, every machine hosts.json knows under that
    name, said to be a guess."""
    out = []
    for e in [run.info, *run.info.get("resumed", [])]:
        if e.get("machine"):
            out.append(e["machine"])
            continue
        host = e.get("host", "?")
        known = " or ".join(f'"{m}"' for m in hosts.get(host, [])) or "unknown"
        out.append(f"host {host}, machine not recorded per run: {known}")
    return list(dict.fromkeys(out))


def run_devices(run: Run) -> list[str]:
    """The devices a run trained on: at its start and at each resume that names one."""
    entries = [run.info, *run.info.get("resumed", [])]
    return list(dict.fromkeys(e["device"] for e in entries if e.get("device"))) or ["?"]


def devices_by_cell(cells: list[CellResult]) -> str | None:
    """Where a table's runs trained on more than one device: each cell's devices, and which
    cells mix them (across seeds, or within a run that resumed elsewhere); else None."""
    per = {c.cell.label: sorted({d for r in c.runs for d in run_devices(r)} - {"?"}) or ["?"]
           for c in cells if c.runs}
    if len({d for ds in per.values() for d in ds} - {"?"}) < 2:  # unrecorded: not a device
        return None
    return "- Devices by cell: " + "; ".join(
        f"{label}: {', '.join(ds)}" + (" (mixed)" if len(ds) > 1 else "")
        for label, ds in per.items())


def provenance(cells: list[CellResult], tag: str, root: Path = RUNS, budget: int | None = None,
               jobs: int = 1) -> str:
    """Data, machine, commits and compute of the runs behind a table, read from the runs; the
    wall time is stated at `jobs` runs side by side, against `budget` minutes where the sweep
    spec sets one (its `jobs:` and `budget: {target: ...}`)."""
    runs = [r for c in cells for r in c.runs]
    if not runs:
        return f"No finished runs yet under `{shown(root)}/{tag}/`."
    commits = sorted({r.info.get("commit") or "?" for r in runs} |
                     {e["commit"] for r in runs for e in r.info.get("resumed", [])
                      if e.get("commit")})  # a resume may run later code
    hosts = read_hosts(root / tag)
    on = Counter(m for r in runs for m in set(run_machines(r, hosts)))  # runs on each
    machines = sorted(on) if len(on) < 2 else \
        [f"{m} ({on[m]} run{'s' * (on[m] != 1)})" for m in sorted(on)]
    devices = sorted({d for r in runs for d in run_devices(r)})
    torch_v = sorted({r.info.get("versions", {}).get("torch") or "?" for r in runs})
    expected = sum(c.expected for c in cells)
    held = sorted({r.holdout for r in runs})
    where = "its test split" if held == [0] else \
        f"{' or '.join(map(str, held))} training images held out of training"
    lines = [
        f"- Data: `{tag}` (CIFAR-10 training images read from the sweep's `--data`; "
        f"validation on {where})",
        f"- Machine: {'; '.join(machines)}; device {', '.join(devices)}; torch "
        f"{', '.join(torch_v)}",
        f"- Commit(s), at each start and resume: {', '.join(f'`{c}`' for c in commits)}",
        f"- Runs: {len(runs)} of {expected} finished; summed run time "
        f"{run_minutes(runs):.1f} min (each run's sweep.json, all its launches; other work "
        "sometimes shared the cores)",
        f"- Wall time of this target: {budget_line(runs, expected, budget, jobs)}" if budget else
        f"- Wall time of this target: about {wall_minutes(runs, jobs):.0f} min {pace(jobs)} "
        f"(its spec's pace) for the {len(runs)} of {expected} runs finished (its spec sets no "
        "time limit)",
    ]
    mixed = devices_by_cell(cells)
    return "\n".join(lines[:2] + ([mixed] if mixed else []) + [kernels_line(runs)] +
                     crossed(cells) + lines[2:])


def kernels_line(runs: list) -> str:
    """How many runs computed on each CPU's kernels (capability and vendor, from run.json's
    floats; a run counts under each it started or resumed on)."""
    return kernels_said([r.info for r in runs])


def kernels_said(infos: list[dict]) -> str:
    """kernels_line from the runs' run.json contents."""
    on = Counter(c or "not recorded" for i in infos for c in set(floatenv.kernels_all(i)))
    words = "; ".join(f"{k}: {n} run{'s' * (n != 1)}" + (", made before runs recorded it"
                                                           if k == "not recorded" else "")
                      for k, n in sorted(on.items()))
    return f"- CPU kernels (`floats.cpu_capability` and `cpu.vendor` in run.json): {words}"


def crossed(cells: list[CellResult]) -> list[str]:
    """The seeds whose runs in different cells computed on different recorded kernels, a line
    each under one heading, naming the cells on each (the most common kernels' cells counted,
    where there are more than three): a comparison paired on such a seed mixes the floats'
    noise into it."""
    by_seed: dict[int, dict[str, list[str]]] = {}
    for c in cells:
        for r in c.runs:
            for cap in set(floatenv.kernels_all(r.info)) - {None}:
                by_seed.setdefault(r.seed, {}).setdefault(cap, []).append(c.cell.label)
    mixed = {s: caps for s, caps in sorted(by_seed.items()) if len(caps) > 1}
    if not mixed:
        return []
    return ["- Paired seeds across kernels (a gap paired on such a seed carries the kernels' "
            "float differences too):",
            *(f"  - seed {s}: {on_kernels(caps)}" for s, caps in mixed.items())]


def on_kernels(caps: dict[str, list[str]]) -> str:
    """Each kernels' cells for one seed: named, but the most common kernels' counted where
    they are more than three."""
    most = max(caps, key=lambda k: (len(caps[k]), k))
    return ", ".join(
        f"{k} in the other {len(ls)} cells" if k == most and len(ls) > 3 else
        f"{k} in {listed(ls)}" for k, ls in sorted(caps.items(), key=lambda kv: kv[0] == most))


def pace(jobs: int) -> str:
    return "one run at a time" if jobs == 1 else f"at {jobs} runs side by side"


def budget_line(runs: list, expected: int, cap: int, jobs: int) -> str:
    """The runs' wall time at `jobs` runs side by side against a budget of `cap` minutes, in one
    sentence."""
    minutes = wall_minutes(runs, jobs)
    done = len({r.path for r in runs})
    scope = "" if done == expected else f" (the {done} of {expected} runs finished so far)"
    verdict = "within it" if minutes <= cap else f"missed, {minutes / cap:.1f}x over"
    return (f"budget {cap} min on this machine; the runs{scope} come to about {minutes:.0f} "
            f"min {pace(jobs)}: {verdict}")


def wall_line(res: dict) -> str:
    """A results.json's wall times as one sentence for its table."""
    parts = []
    if res.get("train_s") is not None:
        parts.append(f"training its runs took {res['train_s'] / 60:.1f} min of wall time "
                     "(their sweep.json, summed; runs share the cores with other jobs)")
    if res.get("measure_s") is not None:
        parts.append(f"the measuring command took {res['measure_s'] / 60:.1f} min")
    return ("Wall time on this machine: " + "; ".join(parts) + ".") if parts else ""


def seeds_line(cells) -> str:
    """Which seeds the table's cells ran, and why not more."""
    seeds = sorted({c["seed"] for c in cells})
    if len(seeds) > 1:
        return f"Seeds {', '.join(map(str, seeds))}."
    return (f"Seed {seeds[0]} of each cell: one seed, because a target gets 30 minutes on this "
            "2-core machine and one 4x2 run takes about 8 minutes at 2 jobs; differences "
            "smaller than a run's swing are not evidence here.")


SWING = (f"Swing: half the peak-to-peak range of val acc over the evaluations in the last "
         f"{WINDOW:.0%} of training (at least {MIN_EVALS}), the claims' \"+/- points\"")
SWING_NOTE = (f"{SWING}; step sd: standard deviation of successive differences there. Mean ± std "
              "over seeds; `-` where no seed finished or every seed diverged.")

METRIC_HEADER = ["seeds", "final val acc (%)", "best val acc (%)", "swing (± pts)",
                 "step sd (pts)", "final train loss"]


def metric_cells(c: CellResult) -> list[str]:
    """A cell's row under METRIC_HEADER."""
    return [c.seeds_note(), c.stat("final").fmt(), c.stat("best").fmt(),
            c.stat("swing").fmt(), c.stat("step_sd").fmt(), c.stat("loss").fmt(2)]


def results_kernels(res: dict, root: Path = RUNS) -> str:
    """The kernels line of a results.json page: of the runs it names (each `run` and `runs`
    entry: a path under the runs folder, under its data tag there, or one whose folders
    include that runs folder's name, as an older measure wrote them), each run once; or of
    the machine that measured it where it names none (its `floats`, recorded by the measuring
    command; "not recorded" in results measured before it was)."""
    named: list[str] = []

    def walk(x, runs: bool = False) -> None:
        if isinstance(x, str) and runs:
            named.append(x)
        elif isinstance(x, dict):
            for k, v in x.items():  # a `runs` by label holds each run's entry
                walk(v, k in ("run", "runs") and not isinstance(v, dict))
        elif isinstance(x, list):
            for v in x:  # a `runs` list: its paths, or each run's entry
                walk(v, runs)

    walk(res)
    if not named:
        floats = res.get("floats")
        return ("- CPU kernels of the machine that measured it (`floats` in results.json): "
                + (floatenv.kernels_of(floats) or "not recorded" if floats else
                   "not recorded, measured before results recorded them"))
    found: dict[Path | str, dict | None] = {}
    for d in named:
        f = run_json(d, root, res.get("tag", ""))
        found[f.resolve() if f else d] = json.loads(f.read_text()) if f else None
    missing = sum(i is None for i in found.values())
    line = kernels_said([i for i in found.values() if i is not None])
    gone = f"run.json not found: {missing} run{'s' * (missing != 1)}" if missing else ""
    return line + "; " + gone if gone and not line.endswith(": ") else line + gone


def run_json(named: str, root: Path, tag: str) -> Path | None:
    """A run's run.json from how a results.json names the run (results_kernels), or None."""
    parts = Path(named).parts
    at = max((i for i, p in enumerate(parts[:-1]) if p == root.name), default=None)
    near = [] if Path(named).is_absolute() else [root / named, root / tag / named]
    for d in (*near, *([root.joinpath(*parts[at + 1:])] if at is not None else [])):
        # the part after the runs folder's name: another checkout's path, read here
        if (d / "run.json").is_file():
            return d / "run.json"
    return None


# the jitter columns' meanings, for a page whose tables show a column without saying what it is
# (each as table-plateau's page words it; bnlab/jitter.py computes them)
COLUMNS = (
    ("von Neumann sd", "Von Neumann sd: sqrt(mean squared successive difference / 2) of val acc "
                       "on the plateau (training's second half), the noise of one evaluation "
                       "with the trend removed: the jitter the rules read."),
    ("churn floor", "Churn floor: the von Neumann sd that the observed prediction flips alone "
                    "would give on this test set if every flip were a fair coin between right "
                    "and wrong; jitter / floor well above 1 means the model's quality itself "
                    "moves between evaluations."),
)  # a swing column's window differs by page (the plateau, or SWING's): each page says its own


def column_terms(text: str) -> str:
    """'Columns: ...': the meaning of each jitter column a table header in `text` shows and
    `text` does not define (its 'Name:' absent); "" where none is missing."""
    rows = text.splitlines()
    heads = " ".join(a.lower() for a, b in zip(rows, rows[1:], strict=False)
                     if a.startswith("| ") and b.startswith("|---"))  # header rows only
    told = [d for col, d in COLUMNS
            if f"| {col.lower()}" in heads and f"{col.lower()}:" not in text.lower()]
    return ("Columns: " + " ".join(told)) if told else ""
