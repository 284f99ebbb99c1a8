"""Reading runs back: the one run reader, per-cell statistics over seeds, a checkpoint's
evaluation (eval.json), the hosts runs ran on (read_hosts) and the decomposition's measures
of a run (split, epoch_end_gain, gains).

Only what the runs logged is used (metrics.jsonl, status.json, run.json, config.yaml,
sweep.json, eval.json); nothing here trains or types a number.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml

from bnlab import checkpoint, jitter
from bnlab.errors import BnlabError
from bnlab.jitter import step_sd, swing, window
from bnlab.lab.analysis import Stat, finite
from bnlab.lab.plan import Cell, Spec, plan
from bnlab.metrics import PREDICTIONS, read_jsonl, read_predictions
from bnlab.paths import ROOT, RUNS
from bnlab.rundir import FINAL, read_status

# libyaml's parser where PyYAML has it (the same safe constructor, about ten times faster):
# `make report` reads the config.yaml of every run of every table, six hundred and more.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Run:
    """One run directory as the trainer left it: its metrics lines and records."""

    path: Path
    status: str | None
    rows: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)  # run.json
    wall_s: float | None = None               # sweep.json: all launches of the run
    seed: int | None = None
    launches: int | None = None               # sweep.json: how many launches it took
    _jitter: dict = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, path: Path, seed: int | None = None) -> Run:
        path = Path(path)
        if not (path / "metrics.jsonl").is_file():
            raise BnlabError(f"{path} holds no metrics.jsonl; pass a run directory.")
        info = json.loads((path / "run.json").read_text()) if (path / "run.json").is_file() \
            else {}
        sweep = json.loads((path / "sweep.json").read_text()) \
            if (path / "sweep.json").is_file() else {}
        return cls(path, read_status(path), read_jsonl(path / "metrics.jsonl"), info,
                   sweep.get("wall_s"), seed, sweep.get("launches"))

    @cached_property
    def cfg(self) -> dict:
        """The resolved config the run trained with (config.yaml)."""
        if not (self.path / "config.yaml").is_file():
            raise BnlabError(f"{self.path} holds no config.yaml; pass a run directory.")
        return yaml.load((self.path / "config.yaml").read_text(), Loader=SAFE_LOADER)

    @property
    def holdout(self) -> int:
        """Training images held out as its validation split (0: it evaluated on the test
        split; also for a run without its config.yaml, which predates the option)."""
        if not (self.path / "config.yaml").is_file():
            return 0
        return self.cfg["data"].get("holdout", 0)

    @property
    def label(self) -> str:
        c = self.cfg
        return (f"{c['model']['name']} {c['norm']['kind']} {self.info.get('world', '?')}x"
                f"{c['batch_per_gpu']}" + (f" acc{c['grad_accum']}" if c["grad_accum"] > 1 else ""))

    def last(self, key: str):
        vals = [r[key] for r in self.rows if key in r]
        return vals[-1] if vals else None

    def series(self, key: str, by: str = "epoch") -> tuple[list[float], list[float]]:
        """`key` at every line that logged it: the lines' `by` (epoch, or step), values."""
        pts = [(r[by], r[key]) for r in self.rows if r.get(key) is not None and by in r]
        return [p[0] for p in pts], [p[1] for p in pts]

    @cached_property
    def epochs(self) -> list[float]:
        """The epochs of the evaluations (val acc)."""
        return self.series("val/acc")[0]

    @cached_property
    def accs(self) -> list[float]:
        """Val acc (%) at each evaluation."""
        return self.series("val/acc")[1]

    @property
    def diverged(self) -> bool:
        # The logger writes a NaN or infinite value as null.
        losses = [r["train/loss"] for r in self.rows if "train/loss" in r]
        return self.status == "diverged" or any(v is None or not math.isfinite(v) for v in losses)

    def end_acc(self, total_epochs: float, tail: float = 0.1) -> float | None:
        """The mean val acc over the evaluations of the last `tail` of training (a run whose
        rate decays to zero ends there); None for a diverged run or one without them."""
        if self.diverged:
            return None
        accs = [a for e, a in zip(self.epochs, self.accs, strict=True)
                if e > (1 - tail) * total_epochs + 1e-9]
        return sum(accs) / len(accs) if accs else None

    def metrics(self, total_epochs: float) -> dict[str, float | None]:
        if self.diverged or not self.accs:
            return {}
        w = window(self.epochs, self.accs, total_epochs)
        return {"final": self.accs[-1], "best": max(self.accs), "swing": swing(w),
                "step_sd": step_sd(w), "loss": self.last("train_epoch/loss"),
                "precise": self.last("val/acc_precise"), "train_s": self.last("time/train_s")}

    @cached_property
    def predictions(self):
        """predictions.jsonl read back (labels, {kind: (epochs, classes)}), or None."""
        f = self.path / PREDICTIONS
        return read_predictions(f) if f.is_file() else None

    def jitter(self, total_epochs: float, kind: str = "ema") -> dict[str, float | None]:
        """bnlab.jitter's measures on the plateau window, for one way of evaluating: `ema`
        (val/acc, the running statistics), `precise` or `batch` (record.decompose)."""
        if (total_epochs, kind) not in self._jitter:
            self._jitter[total_epochs, kind] = self._measure_jitter(total_epochs, kind)
        return self._jitter[total_epochs, kind]

    def _measure_jitter(self, total_epochs: float, kind: str) -> dict[str, float | None]:
        acc_key, loss_key = SERIES[kind]
        if self.diverged:
            return {}
        read = (lambda key: ends(*self.series(key))) if kind in ONE_AN_EPOCH else self.series
        ep, accs = read(acc_key)
        w = jitter.plateau(ep, accs, total_epochs)
        if len(w) < jitter.MIN_EVALS:  # too few for jitter; one an epoch still has a mean
            return {"plateau_acc": float(sum(w) / len(w)), "n_evals": len(w),
                    "final": accs[-1]} if kind in ONE_AN_EPOCH and w and \
                len(w) >= plateau_ends(total_epochs) else {}
        lep, losses = read(loss_key)
        lw = jitter.plateau(lep, losses, total_epochs)
        slope, _ = jitter.trend(w)
        out = {"plateau_acc": float(sum(w) / len(w)), "swing": jitter.swing(w),
               "residual_sd": jitter.residual_sd(w), "vn_sd": jitter.von_neumann_sd(w),
               "slope": slope * len(w) / (total_epochs * (1 - jitter.PLATEAU)),  # per epoch
               "loss_jitter": jitter.loss_jitter(lw) if len(lw) >= jitter.MIN_EVALS else None,
               "n_evals": len(w), "final": accs[-1]}
        pred = self.predictions
        if pred is not None and kind in pred[1]:
            labels, (pep, classes) = pred[0], pred[1][kind]
            keep = [i for i, e in enumerate(pep) if jitter.on_plateau(e, total_epochs)]
            p = classes[keep]
            if len(p) < 2:
                return out
            seen = int((p != jitter.MISSING).all(0).sum())  # images with every prediction
            flips = jitter.flip_share(p, labels)
            floor = jitter.churn_floor(flips, seen)
            out.update({"churn": jitter.churn(p), "flips": flips, "churn_floor": floor,
                        "over_floor": out["vn_sd"] / floor if floor > 0 else None,
                        "binomial_floor": jitter.binomial_floor(out["plateau_acc"], seen)})
        return out


# The val-acc and val-loss keys of each way of evaluating (bnlab.validation.evaluation).
SERIES = {"ema": ("val/acc", "val/loss"), "precise": ("decomp/acc_precise", "decomp/loss_precise"),
          "batch": ("decomp/acc_batch", "decomp/loss_batch"),
          # precise_bn=every_epoch: the evaluation just after each epoch end's recalibration
          "recal": ("val/acc_precise", "val/loss_precise")}
SERIES["ends"] = SERIES["ema"]  # val/acc at epoch ends only: what a `recal` cell pairs with
SERIES["all"] = SERIES["ema"]   # val/acc at every evaluation, whatever it pairs with
# kinds read at epoch ends, one evaluation an epoch: their plateau mean needs every epoch end
# of the plateau (5 in a 10-epoch run), their jitter jitter.MIN_EVALS
ONE_AN_EPOCH = ("recal", "ends")


def ends(epochs: list[float], values: list[float]) -> tuple[list[float], list[float]]:
    """The points at whole epochs (the evaluation at each epoch's end)."""
    keep = [i for i, e in enumerate(epochs) if abs(e - round(e)) < 1e-9]
    return [epochs[i] for i in keep], [values[i] for i in keep]


def plateau_ends(total_epochs: float) -> int:
    """How many epoch ends the plateau window holds (jitter.on_plateau)."""
    return sum(jitter.on_plateau(e, total_epochs) for e in range(1, int(total_epochs) + 1))


def paired_kind(kind: str, other: str) -> str:
    """The evaluations a cell read at `kind` is read at beside a cell read at `other`: val/acc
    at epoch ends only (`ends`) beside a once-an-epoch kind, so both sides sample the same
    points of the plateau; `kind` otherwise (`all` is val/acc at every evaluation always)."""
    return "ends" if kind == "ema" and other in ONE_AN_EPOCH else kind


def run_minutes(runs: list[Run]) -> float:
    """The runs' sweep.json wall times (all launches) summed, each run counted once."""
    return sum({r.path: r.wall_s or 0.0 for r in runs}.values()) / 60


def wall_minutes(runs: list[Run], jobs: int) -> float:
    """Wall time of the runs as a sweep at `jobs` runs side by side would take it."""
    return run_minutes(runs) / jobs


def finished_run(d: Path, seed: int) -> Run | None:
    """A finished run (completed or diverged), or None when it is missing or unfinished."""
    return Run.read(d, seed) if read_status(d) in FINAL else None


def train_seconds(dirs) -> float:
    """The runs' training wall time, summed over their sweep.json records."""
    return round(sum(json.loads((d / "sweep.json").read_text()).get("wall_s", 0.0)
                     for d in dirs if (d / "sweep.json").is_file()), 1)


def read_hosts(folder: Path) -> dict[str, list[str]]:
    """hosts.json read back: each host name -> every machine seen under it (a file written
    before one name could stand for several machines holds one description per name)."""
    f = folder / "hosts.json"
    raw = json.loads(f.read_text()) if f.is_file() else {}
    return {h: [m] if isinstance(m, str) else list(m) for h, m in raw.items()}


def eval_json(d: Path, target: str) -> dict:
    """eval.json of the run in `d`, made with evaluate.py from its checkpoint if the run has
    none yet (`target`: the make target that measures again when the checkpoint is gone)."""
    if not (d / "eval.json").is_file():
        checkpoint.require(d, target)
        p = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), f"run={d}"], cwd=ROOT,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise BnlabError(f"evaluate.py failed on {d}: {p.stderr.strip()[-300:]}")
    return json.loads((d / "eval.json").read_text())


@dataclass
class CellResult:
    cell: Cell
    runs: list[Run]
    expected: int
    kind: str = "ema"  # the evaluations its plateau is read from (Run.jitter's kind)

    @property
    def epochs(self) -> float:
        return self.cell.cfg["epochs"]

    def stat(self, key: str) -> Stat:
        return Stat.of([r.metrics(self.epochs).get(key) for r in self.runs])

    def jitter_values(self, key: str, kind: str | None = None) -> list[float]:
        """A jitter measure (Run.jitter, of `kind`, else the cell's own) of each seed that has
        it."""
        vals = [r.jitter(self.epochs, kind or self.kind).get(key) for r in self.runs]
        return [v for v in vals if finite(v)]

    def jstat(self, key: str, kind: str | None = None) -> Stat:
        return Stat.of(self.jitter_values(key, kind))

    def paired(self, key: str, base: str) -> list[float]:
        """`key - base` in each run that logged both (the same run's weights: a paired
        difference, free of the seed-to-seed spread)."""
        ms = [r.metrics(self.epochs) for r in self.runs]
        return [m[key] - m[base] for m in ms if finite(m.get(key)) and finite(m.get(base))]

    @property
    def diverged(self) -> int:
        return sum(r.diverged for r in self.runs)

    def seeds_note(self) -> str:
        """`3`, or `2/3` while seeds are missing, with diverged runs named."""
        n = f"{len(self.runs)}" if len(self.runs) == self.expected else \
            f"{len(self.runs)}/{self.expected}"
        return n + (f" ({self.diverged} diverged)" if self.diverged else "")

    def mean_series(self, key: str) -> tuple[list[float], list[float], list[float], list[float]]:
        """`key` per logged point: epochs, mean, min, max over the seeds that finished and
        logged it."""
        good = [r.series(key) for r in self.runs if not r.diverged]
        good = [g for g in good if g[0]]
        if not good:
            return [], [], [], []
        n = min(len(ys) for _, ys in good)
        cols = list(zip(*[ys[:n] for _, ys in good], strict=True))
        return (good[0][0][:n], [sum(c) / len(c) for c in cols], [min(c) for c in cols],
                [max(c) for c in cols])

    def mean_curve(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """Val acc per evaluation: epochs, mean, min, max over the seeds that finished."""
        return self.mean_series("val/acc")


def collect(spec: Spec, tag: str, root: Path = RUNS) -> list[CellResult]:
    by_cell: dict[str, list[Run]] = {c.label: [] for c in spec.cells}
    for cell, seed, d in plan(spec, tag, root):
        r = finished_run(d, seed)
        if r is not None:
            by_cell[cell.label].append(r)
    return [CellResult(c, by_cell[c.label], len(c.seeds)) for c in spec.cells]


# ----------------------------------------------------------------------------------------
# The first headline protocol's decomposition, read from one run (record.decompose=true)


def split(run: Run, total_epochs: float) -> dict[str, float] | None:
    """The detrended variance of val acc on the plateau, split (None without the series)."""
    if run.diverged:
        return None
    rows = [r for r in run.rows if r.get("val/acc") is not None
            and r.get("decomp/acc_precise") is not None
            and jitter.on_plateau(r["epoch"], total_epochs)]
    if len(rows) < jitter.MIN_EVALS:
        return None
    return jitter.variance_split([r["val/acc"] for r in rows],
                                 [r["decomp/acc_precise"] for r in rows])


def epoch_end_gain(run: Run, total_epochs: float) -> float | None:
    """C8's paired gain of one run: PreciseBN statistics minus the running statistics on the
    same weights, val acc points, averaged over the epoch ends of the plateau."""
    if run.diverged:
        return None
    gains = [r["decomp/acc_precise"] - r["val/acc"] for r in run.rows
             if r.get("decomp/acc_precise") is not None and r.get("val/acc") is not None
             and jitter.on_plateau(r["epoch"], total_epochs)
             and abs(r["epoch"] - round(r["epoch"])) < 1e-9]
    return float(np.mean(gains)) if gains else None


def gains(c: CellResult | None) -> list[float]:
    if c is None:
        return []
    return [g for g in (epoch_end_gain(r, c.epochs) for r in c.runs) if g is not None]


def fmt(x, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if finite(x) else "-"


def signed(x: float | None, digits: int = 1, plus: str = "+") -> str:
    """fmt with a sign (`plus` for positive numbers), a rounded zero unsigned."""
    if not finite(x):
        return "-"
    text = f"{x:{plus}.{digits}f}"
    return text.lstrip("+-") if float(text) == 0 else text


# ----------------------------------------------------------------------------------------
# What the verdict rules read of a cell


def mean_of(c: CellResult | None, key: str) -> float | None:
    """The mean over seeds of a cell's `key` (None: no cell, or no seed finished)."""
    return None if c is None else c.stat(key).mean


def shown_stat(c: CellResult | None, key: str = "swing") -> str:
    """`mean ± std` of a cell's `key`, `-` without one."""
    return "-" if c is None else c.stat(key).fmt()


def side_by_side(x: CellResult | None, y: CellResult | None, lx: str, ly: str) -> str:
    """`swing X ±a, Y ±b; final acc c vs d`: two cells side by side."""
    return (f"swing {lx} ±{shown_stat(x)}, {ly} ±{shown_stat(y)}; final acc "
            f"{shown_stat(x, 'final')} vs {shown_stat(y, 'final')}")


def missing(*vals) -> bool:
    return any(v is None for v in vals)
