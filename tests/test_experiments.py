"""The experiment machinery: swing, the sweep runner, tables from logs, and a smoke run of
every cell of every experiment for a few steps."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bnlab import dist, trainer
from bnlab.analysis import MIN_EVALS, Stat, step_sd, swing, window
from bnlab.errors import BnlabError
from bnlab.results import collect
from bnlab.rundir import read_status, set_status
from bnlab.sweep import ROOT, Cell, Spec, compose, load_spec, plan, sweep
from bnlab.tables import build
from bnlab.verdicts import verdicts
from conftest import CIFAR_MINI, needs_cifar, run_entry

SPECS = sorted((ROOT / "experiments").glob("*/sweep.yaml"))


# -- swing ---------------------------------------------------------------------------------

def test_swing_is_half_the_range_over_the_last_40_percent():
    epochs = [i / 5 for i in range(1, 26)]  # 5 evaluations per epoch, 5 epochs
    accs = [50.0] * 14 + [40.0, 60.0, 45.0, 55.0, 50.0, 52.0, 48.0, 50.0, 51.0, 49.0, 50.0]
    w = window(epochs, accs, 5)
    assert len(w) == 11 and w[0] == 40.0  # from epoch 3.0 (60% of 5) on
    assert swing(w) == 10.0
    diffs = [b - a for a, b in zip(w, w[1:], strict=False)]
    mean = sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1))
    assert step_sd(w) == pytest.approx(sd)


def test_swing_refuses_too_few_evaluations():
    with pytest.raises(ValueError, match=str(MIN_EVALS)):
        swing([1.0] * (MIN_EVALS - 1))


def test_stat_counts_only_finite_values():
    s = Stat.of([1.0, 3.0, float("nan"), None])
    assert (s.mean, s.n) == (2.0, 2) and s.std == pytest.approx(math.sqrt(2))
    assert Stat.of([None]).fmt() == "-"


# -- sweep specs -----------------------------------------------------------------------------

def test_runs_are_keyed_by_the_resolved_config():
    jitter = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    batch = load_spec(ROOT / "experiments/batch/sweep.yaml")
    ranks = load_spec(ROOT / "experiments/ranks/sweep.yaml")
    j = {c.label: c.key for c in jitter.cells}
    b = {c.label: c.key for c in batch.cells}
    r = {c.label: c.key for c in ranks.cells}
    # The same experiment reached through different specs and names shares its runs...
    assert j["bn"] == b["bn 2"] == r["4 ranks x 2"]
    assert j["syncbn"] == b["syncbn 2"] and j["gn (32 groups)"] == b["gn 2"]
    assert r["4 ranks x 8"] == b["bn 8"]
    # ...and anything that changes the computation changes the key.
    assert len(set(j.values())) == len(j)
    assert r["4 ranks x 2 + grad_accum 4"] != b["bn 8"]
    same = compose(["experiment=jitter", "log_every=7", "name=other", "progress=false"])
    assert Cell("x", [], [0], same).key == j["bn"]


def test_a_cell_that_does_not_compose_fails_before_anything_runs(tmp_path):
    spec = tmp_path / "bad" / "sweep.yaml"
    spec.parent.mkdir()
    spec.write_text("experiment: jitter\ncells:\n  - {label: x, overrides: [norm=nope]}\n")
    with pytest.raises(BnlabError, match="norm=nope"):
        load_spec(spec)
    spec.write_text("experiment: jitter\ncells:\n  - {label: x, overrides: [batch_per_gpu=0]}\n")
    with pytest.raises(BnlabError, match="batch_per_gpu"):
        load_spec(spec)


def test_plan_runs_every_cell_once_seed_major_and_expensive_cells_last():
    specs = [load_spec(p) for p in SPECS]
    steps = plan(specs, "tag")
    dirs = [d for _, _, d in steps]
    assert len(dirs) == len(set(dirs))
    expected = {(c.key, s) for sp in specs for c in sp.cells for s in c.seeds}
    assert {(d.parent.name, int(d.name[4:])) for d in dirs} == expected
    orders = [c.meta.get("order", 0) for c, _, _ in steps]
    assert orders == sorted(orders)
    first = [s for c, s, _ in steps if c.meta.get("order", 0) == 0]
    assert first == sorted(first)


def tiny_spec(tmp_path: Path, num_train: int = 64) -> Spec:
    """Two cells on generated data, a few steps each: the runner's real code path."""
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


def test_sweep_runs_cells_skips_finished_ones_and_sets_unfinished_aside(tmp_path):
    spec = tiny_spec(tmp_path)
    root = tmp_path / "runs"
    assert sweep([spec], None, jobs=2, root=root) == {"completed": 2}
    dirs = [d for _, _, d in plan(spec, "synthetic-64", root)]
    assert all(read_status(d) == "completed" for d in dirs)
    assert json.loads((dirs[0] / "sweep.json").read_text())["rc"] == 0
    assert (root / "synthetic-64" / "hosts.json").is_file()
    before = (dirs[0] / "metrics.jsonl").read_text()
    assert sweep([spec], None, jobs=2, root=root) == {}  # nothing re-run, nothing touched
    assert (dirs[0] / "metrics.jsonl").read_text() == before
    (dirs[1] / "checkpoint.pt").unlink()
    set_status(dirs[1], "running")  # as if the machine died mid-run, before any checkpoint
    set_status(dirs[0], "preempted")  # as if stopped after its last checkpoint
    assert sweep([spec], None, jobs=1, root=root) == {"completed": 2}
    kept = dirs[1].with_name("seed0.unfinished-1")
    assert kept.is_dir() and read_status(kept) == "running"
    assert read_status(dirs[1]) == "completed"
    assert "from_step" in json.loads((dirs[0] / "run.json").read_text())["resumed"][0]
    assert json.loads((dirs[0] / "sweep.json").read_text())["launches"] == 2
    assert (dirs[0] / "metrics.jsonl").read_text() == before  # resumed at the end: no new rows


@pytest.mark.slow  # CI time (71 s); resuming preempted runs is also in the test above
def test_sigterm_stops_the_sweep_and_the_same_command_resumes_it(tmp_path):
    spec = tiny_spec(tmp_path, num_train=512)
    root = tmp_path / "runs"
    cmd = [sys.executable, "-m", "bnlab.sweep", str(spec.path), "--jobs", "1", "--runs",
           str(root)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    first = plan(spec, "synthetic-512", root)[0][2]
    deadline = time.monotonic() + 120
    while not (first / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 75, out
    assert "run the same command to resume" in out
    assert read_status(first) == "preempted" and (first / "checkpoint.pt").is_file()
    second = plan(spec, "synthetic-512", root)[1][2]
    assert not second.exists()  # queued runs do not start once the sweep is stopping
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "will resume preempted run" in done.stdout
    assert read_status(first) == read_status(second) == "completed"
    assert json.loads((first / "sweep.json").read_text())["launches"] == 2


# -- tables from logs ------------------------------------------------------------------------

def fake_run(d: Path, accs: list[float], loss: float = 1.0, status: str = "completed",
             precise: float | None = None) -> None:
    """A run directory as the trainer writes it, with chosen val acc values."""
    d.mkdir(parents=True)
    rows = [{"step": i, "epoch": (i + 1) / 5, "val/acc": a} for i, a in enumerate(accs)]
    rows.append({"step": 99, "epoch": 5, "train/loss": loss, "train_epoch/loss": loss,
                 "time/train_s": 10.0, **({"val/acc_precise": precise} if precise else {})})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "run.json").write_text(json.dumps({"commit": "abc", "host": "h", "device": "cpu"}))
    (d / "sweep.json").write_text(json.dumps({"wall_s": 60.0}))
    set_status(d, status)


def test_tables_and_verdicts_are_computed_from_the_logs(tmp_path):
    root, tag = tmp_path / "runs", "cifar10-test"
    spec = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    cells = {c.label: c for c in spec.cells}
    flat = [30.0] * 14
    for seed in (0, 1, 2):
        d = root / tag / cells["bn"].key / f"seed{seed}"
        fake_run(d, flat + [20.0, 40.0 + seed] + [30.0] * 9)  # swing 10 + seed / 2
        fake_run(root / tag / cells["syncbn"].key / f"seed{seed}", flat + [29.0, 31.0] + flat[:9])
    fake_run(root / tag / cells["ln"].key / "seed0", flat * 2, loss=float("nan"),
             status="diverged")
    out = tmp_path / "out"
    res = build("jitter", tag, root, out)
    text = (out / "table.md").read_text()
    assert res["bn"].stat("swing").fmt() == "10.5 ± 0.5"
    assert "| bn | 3 | 30.0 ± 0.0 | 41.0 ± 1.0 | 10.5 ± 0.5 |" in text
    assert "| syncbn | 3 | 30.0 ± 0.0 | 31.0 ± 0.0 | 1.0 ± 0.0 |" in text
    assert "| ln | 1/3 (1 diverged) | - |" in text  # diverged: shown as such, not dropped
    assert "3 of 3" not in text and "7 of 38 finished" in text
    assert "the 7 of 38 runs finished so far) come to about 4 min" in text
    assert (out / "jitter.png").stat().st_size > 10_000
    c1 = next(v for v in verdicts({"jitter": res, "batch": {}, "ranks": {}}) if v.claim == "C1")
    assert c1.verdict == "reproduced" and "10.5x" in c1.why


def test_tables_without_runs_say_so(tmp_path):
    res = build("ranks", "none", tmp_path / "runs", tmp_path / "out")
    assert all(not c.runs for c in res.values())
    assert "No finished runs yet" in (tmp_path / "out" / "table.md").read_text()


# -- every experiment config, a few steps ----------------------------------------------------

def smoke_cfg(cell: Cell) -> dict:
    cfg = json.loads(json.dumps(cell.cfg))
    micro = cfg["batch_per_gpu"] * cfg["dist"]["simulate"] * cfg["dist"]["nproc_per_node"]
    cfg["data"].update(root=str(CIFAR_MINI), download=False, val_limit=64,
                       train_limit=2 * micro * cfg["grad_accum"])
    cfg.update(epochs=1, eval_every=1, max_steps=0, progress=False, checkpoint=False)
    cfg["precise_bn"]["num_samples"] = micro // cfg["batch_per_gpu"] * cfg["precise_bn"]["batch"]
    return cfg


def unique_cells(real: bool) -> list[Cell]:
    seen, out = set(), []
    for p in SPECS:
        for c in load_spec(p).cells:
            if c.key not in seen and (c.cfg["dist"]["nproc_per_node"] > 1) == real:
                seen.add(c.key)
                out.append(c)
    return out


@needs_cifar
@pytest.mark.parametrize("cell", unique_cells(real=False), ids=lambda c: c.key)
def test_every_experiment_cell_trains_a_few_steps(cell, tmp_path):
    cfg = smoke_cfg(cell)
    env = dist.init("cpu", "auto", 60, 0)
    res = trainer.run(cfg, tmp_path, env)
    assert read_status(tmp_path) == "completed"
    assert math.isfinite(res["val/acc"])
    if cfg["precise_bn"]["every"]:
        assert "val/acc_precise" in res


@needs_cifar
@pytest.mark.slow  # 4 real gloo processes per cell; the 4-process path is tested in test_train
def test_real_ddp_experiment_cells_run_a_few_steps(tmp_path):
    for cell in unique_cells(real=True):
        cfg = smoke_cfg(cell)
        args = [*cell.overrides, f"data.root={CIFAR_MINI}", "data.download=false",
                f"data.train_limit={cfg['data']['train_limit']}", "data.val_limit=64",
                "epochs=1", "eval_every=1", "max_steps=0", "progress=false",
                "checkpoint=false", f"hydra.run.dir={tmp_path / cell.key}"]
        p = run_entry("train.py", *args, cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-2000:]
        assert read_status(tmp_path / cell.key) == "completed"
        assert json.loads((tmp_path / cell.key / "run.json").read_text())["processes"] == 4


def test_collect_ignores_unfinished_runs(tmp_path):
    spec = load_spec(ROOT / "experiments/ranks/sweep.yaml")
    cell = spec.cells[0]
    fake_run(tmp_path / "t" / cell.key / "seed0", [1.0] * 25, status="running")
    assert collect(spec, "t", tmp_path)[0].runs == []


class _Cell:
    """A table cell with given means (what the verdict rules read)."""

    def __init__(self, final: float):
        self.final = final

    def stat(self, key: str) -> Stat:
        return Stat.of([self.final])


def test_l1_compares_only_sizes_where_both_rows_learned():
    from bnlab.verdicts import l1

    accs = {"bn": {32: 30.0, 16: 35.0, 8: 39.5, 4: 33.0, 2: 16.4},
            "gn": {32: 10.8, 16: 9.0, 8: 31.8, 4: 37.7, 2: 40.6}}
    table = {"batch": {f"{r} {b}": _Cell(a) for r, by in accs.items() for b, a in by.items()}}
    v = l1(table)
    assert v.verdict == "reproduced" and "from 8 to 2" in v.ours
    assert "gn at 32, gn at 16" in v.why and "quarter" not in v.why
    table["batch"]["gn 16, lr / 4"] = _Cell(42.5)
    assert l1(table).why.endswith("(not ruled on): final acc 42.5% at 16.")
    assert l1(table).verdict == "reproduced"
    table["batch"]["gn 8"] = _Cell(11.0)
    assert l1(table).verdict == "not reproduced"


def test_losslog_compares_the_two_curves_of_one_run(tmp_path, monkeypatch):
    from bnlab import losslog

    spec = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    cell = next(c for c in spec.cells if c.label == "bn")
    d = tmp_path / "runs" / "t" / cell.key / "seed0"
    d.mkdir(parents=True)
    sparse = [2.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0, 2.0]
    mean = [2.0, 2.2, 2.0, 2.2, 2.0, 2.2, 2.0, 2.1]
    (d / "metrics.jsonl").write_text("".join(
        json.dumps({"step": 25 * (i + 1), "train/loss": m, "train/loss_rank0": s}) + "\n"
        for i, (s, m) in enumerate(zip(sparse, mean, strict=True))))
    monkeypatch.setattr(losslog, "README", tmp_path / "README.md")
    losslog.build(["bn"], 0, "t", out=tmp_path / "out", root=tmp_path / "runs")
    text = (tmp_path / "out" / "table.md").read_text()
    ratio = step_sd(sparse) / step_sd(mean)
    assert f"{ratio:.1f}x" in text and "**C13 verdict: reproduced.**" in text
    assert (tmp_path / "out" / "losslog.png").stat().st_size > 0
    assert "<!-- c13:begin -->" in (tmp_path / "README.md").read_text()
    with pytest.raises(BnlabError, match="run `make table-jitter` first"):
        losslog.build(["syncbn"], 0, "t", out=tmp_path / "out", root=tmp_path / "runs")


def test_tables_state_their_wall_time_from_the_run_records(tmp_path):
    from bnlab.sweep import train_seconds, wall_line

    for i, w in enumerate([100.0, 50.5]):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "sweep.json").write_text(json.dumps({"wall_s": w}))
    (tmp_path / "no-record").mkdir()
    assert train_seconds(sorted(tmp_path.iterdir())) == 150.5
    line = wall_line({"train_s": 150.5, "measure_s": 30.0})
    assert "training its runs took 2.5 min" in line and "took 0.5 min" in line
    assert wall_line({}) == ""


def test_tables_name_their_seeds_and_say_why_only_when_one():
    from bnlab.sweep import seeds_line

    assert seeds_line([{"seed": 1}, {"seed": 1}]).startswith("Seed 1 of each cell: one seed")
    assert seeds_line([{"seed": 2}, {"seed": 1}]) == "Seeds 1, 2."


def test_a_run_killed_by_the_sweeps_signal_before_it_began_is_not_started(tmp_path):
    """SIGTERM can reach train.py before it installs its handler (while it imports): that run
    never began, so it is reported as not started and leaves no directory to set aside."""
    from bnlab.sweep import Jobs, launch

    class Early(Jobs):
        def start(self, cmd, **kw):
            proc = super().start([sys.executable, "-c", "import time; time.sleep(60)"], **kw)
            self.stop()
            return proc

    d = tmp_path / "cell" / "seed0"
    cell = Cell("a", ["experiment=demo"], [0])
    assert launch(cell, 0, d, None, 1, [], Early()) == ("not started", 0.0)
    assert not d.exists()


def test_the_budget_line_counts_each_run_once_and_says_whether_it_was_met():
    from bnlab.results import RunResult, budget_line

    runs = [RunResult(Path(f"r{i}"), 0, "completed", wall_s=600.0) for i in range(9)]
    # 9 runs of 10 min at 2 side by side: 45 min, the per-target budget exactly.
    assert budget_line(runs + runs[:3], 9, "target").endswith("come to about 45 min at 2 runs "
                                                              "side by side: within it")
    over = budget_line(runs + [RunResult(Path("r9"), 0, "completed", wall_s=1800.0)], 12,
                       "target")
    assert "(the 10 of 12 runs finished so far)" in over and "60 min" in over
    assert over.endswith("missed, 1.3x over")
    assert budget_line(runs, 9, "all").startswith("budget 120 min") and "within it" in \
        budget_line(runs, 9, "all")


def test_the_precisebn_row_is_plotted_after_each_recalibration_not_as_a_second_ema_curve(
        tmp_path):
    import matplotlib.pyplot as plt

    from bnlab.plots import _precise_points
    from bnlab.results import CellResult, load_run

    spec = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    cell = next(c for c in spec.cells if "PreciseBN" in c.label)
    fake_run(tmp_path / "p", [30.0] * 25, precise=25.0)
    fake_run(tmp_path / "e", [30.0] * 25)
    ax = plt.figure().add_subplot()
    assert not _precise_points(ax, CellResult(cell, [load_run(tmp_path / "e", 0)], 3))
    assert _precise_points(ax, CellResult(cell, [load_run(tmp_path / "p", 0)], 3))
    (line,) = ax.get_lines()[:1]
    assert list(line.get_ydata()) == [25.0] and "after each recalibration (n=1)" in \
        ax.get_legend_handles_labels()[1][0]
    plt.close("all")


def test_the_batch_table_gives_each_columns_optimizer_steps_from_the_logs(tmp_path):
    root, tag = tmp_path / "runs", "cifar10-test"
    spec = load_spec(ROOT / "experiments/batch/sweep.yaml")
    cell = next(c for c in spec.cells if c.meta["row"] == "bn" and c.meta["col"] == 2)
    fake_run(root / tag / cell.key / "seed0", [30.0] * 25)
    build("batch", tag, root, tmp_path / "out")
    text = (tmp_path / "out" / "table.md").read_text()
    assert "| optimizer steps (from the logs) | - | - | - | - | 99 |" in text


def test_c8_rules_on_each_seeds_own_weights_not_on_the_means(tmp_path):
    from bnlab.verdicts import c8

    root, tag = tmp_path / "runs", "cifar10-test"
    spec = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    cell = next(c for c in spec.cells if "PreciseBN" in c.label)
    # The means differ by +1.5, but PreciseBN helped in one seed only.
    for seed, (ema, pre) in enumerate([(16.0, 14.0), (18.0, 17.5), (13.0, 20.0)]):
        fake_run(root / tag / cell.key / f"seed{seed}", [ema] * 25, precise=pre)
    v = c8({"jitter": build("jitter", tag, root, tmp_path / "out")})
    assert v.verdict == "not reproduced" and "-2.0, -0.5, +7.0 (mean +1.5 ± 4.8)" in v.ours
    assert "in 1 of 3 seeds" in v.why
    for seed, pre in enumerate([17.5, 19.0, 14.0]):
        d = root / tag / cell.key / f"seed{seed}"
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
        fake_run(d, [[16.0, 18.0, 13.0][seed]] * 25, precise=pre)
    assert c8({"jitter": build("jitter", tag, root, tmp_path / "out")}).verdict == "reproduced"


def test_c1_also_reports_the_cifar_stem_where_bn_learns_without_ruling_on_it():
    from bnlab.verdicts import c1

    t = {"jitter": {"bn": _Cell(4.0), "syncbn": _Cell(4.0)}}
    assert "resnet18_cifar" not in c1(t).why
    t["jitter"].update({"resnet18_cifar bn": _Cell(6.0), "resnet18_cifar syncbn": _Cell(3.0)})
    v = c1(t)
    assert v.verdict == "not reproduced"  # the rule reads the reports' model only
    assert "final val acc 6.0%), bn swings 2.0x as much as syncbn (not ruled on)" in v.why
