"""`make demo`: the finding in under two minutes. bn, syncbn and gn train side by side at 4
simulated ranks x 2 images (configs/experiment/demo.yaml), then one plot and one table show
their validation curves and jitter, built only from the runs' own logs.

    python -m bnlab.lab.demo --out outputs/demo/<stamp>             # generated data, offline
    python -m bnlab.lab.demo --out outputs/demo/<stamp> --data DIR  # CIFAR-10 from DIR
    python -m bnlab.lab.demo --out outputs/demo/<stamp> --report    # no training: table again

The default data is the synthetic set made easy (per-pixel noise 0.2 instead of 1.2): each
class is a smooth colour pattern, so a model that trains well reaches ~100% within the demo's
250 steps, and what stays in its curve is the jitter. The model is C1's as reported, torchvision
resnet18: at 32x32 inputs its last stage holds 1x1 maps, so at 2 images per rank BN
normalizes over 2 values per channel (the run's warning names those layers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bnlab.cli import run_cli
from bnlab.errors import BnlabError
from bnlab.jitter import PLATEAU
from bnlab.lab.figures import plt, save
from bnlab.lab.page import md_table
from bnlab.lab.plan import Spec
from bnlab.lab.readme import HEADLINE
from bnlab.lab.results import Run, fmt
from bnlab.lab.spec import read_data_tag, spec_from
from bnlab.lab.sweep import outcome, sweep
from bnlab.paths import CONFIGS

NORMS = ("bn", "syncbn", "gn")
SYNTHETIC = ["data.noise=0.2"]   # the generated set made easy enough to converge in the demo
SPEC = {"experiment": "demo", "seeds": [0],
        "cells": [{"label": n, "overrides": [f"norm={n}"]} for n in NORMS]}
COLUMNS = ("norm", "status", "final val acc", "plateau val acc", "swing (+/- pts)",
           "von Neumann sd (pts)", "churn floor (pts)", "log val-loss jitter", "min BN values",
           "train s")


def spec(data: str | None) -> Spec:
    """The demo's three cells; with `data`, on CIFAR-10 read from it."""
    extra = ["data=cifar10"] if data else SYNTHETIC
    raw = {**SPEC, "cells": [{**c, "overrides": [*c["overrides"], *extra]}
                             for c in SPEC["cells"]]}
    return spec_from(raw, CONFIGS / "experiment" / "demo.yaml", data, name="demo")


def runs_in(out: Path) -> list[Run]:
    """The demo's runs under `out`/runs/<data tag>/<cell>/seed0, in the order of NORMS, read
    from the folder alone (no data needed): one sentence where there are none, or where runs
    of two data sets share the folder."""
    tags = sorted({d.parent.parent.name for d in (out / "runs").glob("*/*/seed0")})
    if len(tags) != 1:
        why = f"demo runs of {len(tags)} data sets ({', '.join(tags)})" if tags else \
            "no demo runs"
        raise BnlabError(f"{out} holds {why}; run `python -m bnlab.lab.demo --out DIR` with a "
                         "new DIR (add --data DIR for CIFAR-10).")
    runs = [Run.read(d) for d in sorted((out / "runs" / tags[0]).glob("*/seed0"))]
    return sorted(runs, key=lambda r: NORMS.index(r.cfg["norm"]["kind"]))


def row(run: Run) -> dict:
    j = run.jitter(run.cfg["epochs"])
    counts = run.info.get("bn_values_per_channel") or {}
    return {"norm": run.cfg["norm"]["kind"], "status": run.status or "?",
            "final val acc": run.accs[-1] if run.accs else None,
            "plateau val acc": j.get("plateau_acc"), "swing (+/- pts)": j.get("swing"),
            "von Neumann sd (pts)": j.get("vn_sd"), "churn floor (pts)": j.get("churn_floor"),
            "log val-loss jitter": j.get("loss_jitter"),
            "min BN values": min(counts.values()) if counts else None,
            "train s": run.last("time/train_s")}


def shown(v, digits: int = 2) -> str:
    return str(v) if isinstance(v, int | str) else fmt(v, digits)


def plot(runs: list[Run], rows: list[dict], out: Path, title: str) -> None:
    """Val acc and val loss at every evaluation, one line per norm; the legend carries each
    run's jitter on the plateau (shaded) beside the test set's churn floor."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5.2))
    total = runs[0].cfg["epochs"]
    for run, r in zip(runs, rows, strict=True):
        acc, sd, floor, swing = (shown(r[k], 1) for k in (
            "plateau val acc", "von Neumann sd (pts)", "churn floor (pts)", "swing (+/- pts)"))
        label = (f"{r['norm']}: {acc}% on the plateau, jitter {sd} pts (floor {floor}), "
                 f"swing +/-{swing}")
        ax1.plot(*run.series("val/acc"), marker=".", label=label)
        ax2.plot(*run.series("val/loss"), marker=".", label=r["norm"])
    for ax in (ax1, ax2):
        ax.axvspan(PLATEAU * total, total, color="0.9", zorder=0)
        ax.set_xlabel("epoch (shaded: the plateau, where jitter is measured)")
        ax.grid(alpha=0.3)
    ax1.set(ylabel="val accuracy (%)", ylim=(0, 100))
    ax2.set(ylabel="val loss (log scale)", yscale="log")
    ax1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.16))
    ax2.legend(fontsize=8, loc="upper right")
    save(fig, out, title, dpi=110)


COLLAPSE = 10.0  # points below syncbn on the plateau that the demo calls a collapse


def shows(rows: list[dict], sweeps: bool = True) -> str:
    """What the demo's own runs show, in a sentence, from its table's numbers; `sweeps`: the
    sweeps' findings follow it."""
    by = {r["norm"]: r for r in rows}
    acc = {n: by[n]["plateau val acc"] for n in NORMS if by.get(n, {}).get("plateau val acc")
           is not None}
    if "bn" not in acc or "syncbn" not in acc:
        return "bn or syncbn has no plateau to compare (see its status above)."

    def versus(n: str) -> str:
        d = acc[n] - acc["bn"]
        return f"{abs(d):.1f} points {'below' if d >= 0 else 'above'} {n}"

    gap, values = acc["syncbn"] - acc["bn"], by["bn"]["min BN values"]
    where = (f"where its smallest BN layer normalizes {values} values per channel per rank"
             if values else "at 2 images per rank")
    head = f"bn ends {versus('syncbn')} on the plateau" + \
        (f" and {versus('gn')}" if "gn" in acc else "") + f", {where}"
    if gap < COLLAPSE:
        return f"{head}: no collapse in this run (the demo calls {COLLAPSE:g} points one)."
    fine = [n for n in acc if n != "bn" and acc["syncbn"] - acc[n] < COLLAPSE]
    return (f"{head}: BN collapses, while {' and '.join(fine)} train"
            f"{'s' * (len(fine) == 1)} on the same images in the same steps. This is the large "
            "effect. The jitter columns do not test the headline claim, which is about a BN "
            "that learns: bn's curve here is that of a model near chance"
            + ("; the sweeps below test it where bn learns." if sweeps else "."))


FULL = 50_000  # CIFAR-10's training images


def data_words(tags: list[str]) -> str:
    """What the sweeps trained on, from their data tags (headline.json's `data`,
    `<name>-<training images>`): CIFAR-10's 50,000 images, a subset of them, or another set."""
    if not tags:
        raise ValueError("headline.json names no data")

    def one(tag: str) -> str:
        name, n = read_data_tag(tag)
        if name != "cifar10":
            return f"{n:,} {name} images"
        return "CIFAR-10" if n == FULL else f"a {n:,}-image subset of CIFAR-10"
    words = [one(t) for t in tags]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def found() -> list[str]:
    """The sweeps' verdicts in a few words, as `make report` last wrote them from the runs in
    experiments/runs (experiments/headline.json), under a line naming the data they trained on;
    none where it is missing or unreadable."""
    try:
        h = json.loads(HEADLINE.read_text())
        mark = " (sweeps still running)" if h["preliminary"] else ""
        data = data_words(list(h["data"]))
        lines = [x for i, f in enumerate(h["findings"], 1) for x in (
            f"{i}. {f['text']} (`make table-{f['table']}`)",
            *(f"   - {u['text']} (`make table-{u['table']}`)" for u in f.get("under", [])))]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return ["", f"**What the sweeps found** (the full protocol, on {data}):", *lines,
            f"\nFrom `make report` on the CIFAR-10 runs in experiments/runs{mark}; "
            "every claim: experiments/README.md."]


def write(runs: list[Run], out: Path, title: str) -> None:
    """`out`/table.md and `out`/demo.png from the demo's runs."""
    rows = [row(r) for r in runs]   # reads every run first: bad input leaves nothing behind
    table = md_table(list(COLUMNS), [[shown(r[c]) for c in COLUMNS] for r in rows])
    src = "\n".join(f"- `{r.path}` (commit {r.info.get('commit')})" for r in runs)
    sweeps = found()
    summary = "\n".join([f"**What this demo shows:** {shows(rows, bool(sweeps))}", *sweeps])
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(
        f"# {title}\n\n{table}\n\n{summary}\n\nJitter: the von Neumann sd of val acc on the "
        f"plateau (the evaluations after the first {PLATEAU:.0%} of training), the noise of one "
        "evaluation; churn floor: what prediction flips alone would give on this test set "
        "(bnlab/jitter.py). Swing: half the range on the plateau, the claims' '+/- points'.\n\n"
        f"Generated by `python -m bnlab.lab.demo` from:\n{src}\n")
    plot(runs, rows, out / "demo.png", title)
    print(table)
    print(f"\n{summary}")
    print(f"\nwrote {out / 'table.md'} and {out / 'demo.png'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the runs, table and plot")
    p.add_argument("--data", help="folder holding cifar-10-batches-py (default: generated data)")
    p.add_argument("--jobs", type=int, default=len(NORMS),
                   help="runs side by side (default: all three at once)")
    p.add_argument("--report", action="store_true",
                   help="no training: the table and plot again from the runs in --out")
    a = p.parse_args(argv)

    def body() -> int:
        if a.jobs < 1:
            raise BnlabError(f"--jobs={a.jobs} must be at least 1.")
        if not a.report:
            t0 = time.perf_counter()
            status = outcome(sweep([spec(a.data)], a.data, a.jobs, root=a.out / "runs"),
                             (time.perf_counter() - t0) / 60)
            if status:
                return status
        runs = runs_in(a.out)
        what = "CIFAR-10" if runs[0].cfg["data"]["name"] == "cifar10" else "generated data"
        write(runs, a.out, f"bnlab demo: resnet18, 4 simulated ranks x 2 images ({what})")
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
