"""Runs read back: unfinished runs left out, wall times from the run records, and the lines
every table states at its head."""

from __future__ import annotations

import json
from pathlib import Path

from bnlab.lab.results import Run, collect
from bnlab.lab.spec import load_spec
from bnlab.paths import ROOT
from conftest import fake_run


def test_collect_ignores_unfinished_runs(tmp_path):
    spec = load_spec(ROOT / "experiments/ranks/sweep.yaml")
    cell = spec.cells[0]
    fake_run(tmp_path / "t" / cell.key / "seed0", [1.0] * 25, status="running")
    assert collect(spec, "t", tmp_path)[0].runs == []


def test_tables_state_their_wall_time_from_the_run_records(tmp_path):
    from bnlab.lab.page import wall_line
    from bnlab.lab.results import train_seconds

    for i, w in enumerate([100.0, 50.5]):
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "sweep.json").write_text(json.dumps({"wall_s": w}))
    (tmp_path / "no-record").mkdir()
    assert train_seconds(sorted(tmp_path.iterdir())) == 150.5
    line = wall_line({"train_s": 150.5, "measure_s": 30.0})
    assert "training its runs took 2.5 min" in line and "took 0.5 min" in line
    assert wall_line({}) == ""


def test_tables_name_their_seeds_and_say_why_only_when_one():
    from bnlab.lab.page import seeds_line

    assert seeds_line([{"seed": 1}, {"seed": 1}]).startswith("Seed 1 of each cell: one seed")
    assert seeds_line([{"seed": 2}, {"seed": 1}]) == "Seeds 1, 2."


def test_the_budget_line_counts_each_run_once_and_says_whether_it_was_met():
    from bnlab.lab.page import budget_line

    runs = [Run(Path(f"r{i}"), "completed", wall_s=600.0) for i in range(9)]
    # 9 runs of 10 min at 2 side by side: 45 min, the per-target budget exactly.
    assert budget_line(runs + runs[:3], 9, 45, 2).endswith("come to about 45 min at 2 runs "
                                                              "side by side: within it")
    over = budget_line(runs + [Run(Path("r9"), "completed", wall_s=1800.0)], 12, 45, 2)
    assert "(the 10 of 12 runs finished so far)" in over and "60 min" in over
    assert over.endswith("missed, 1.3x over")
    assert budget_line(runs, 9, 120, 2).startswith("budget 120 min") and "within it" in \
        budget_line(runs, 9, 120, 2)


def test_a_table_names_each_cells_devices_and_the_cells_that_mix_them(tmp_path):
    """A run records its device at its start and at each resume; a table whose runs used more
    than one device says which cells ran where and which mix them."""
    from bnlab.lab.page import provenance
    from bnlab.rundir import note_resume

    spec = load_spec(ROOT / "experiments/ranks/sweep.yaml")
    a, b = spec.cells[:2]
    for cell, seed in ((a, 0), (a, 1), (b, 0)):
        fake_run(tmp_path / "t" / cell.key / f"seed{seed}", [1.0] * 25)
    same = provenance(collect(spec, "t", tmp_path), "t", tmp_path)
    assert "device cpu;" in same and "Devices by cell" not in same  # one device: one word
    note_resume(tmp_path / "t" / a.key / "seed1", 10, 0, "cuda:0")  # resumed on a GPU
    mixed = provenance(collect(spec, "t", tmp_path), "t", tmp_path)
    assert "device cpu, cuda:0;" in mixed
    assert f"- Devices by cell: {a.label}: cpu, cuda:0 (mixed); {b.label}: cpu" in mixed
    # runs on two machines: each named with how many of the runs trained on it
    for cell, seed, m in ((a, 0, "cpu A"), (a, 1, "cpu B"), (b, 0, "cpu A")):
        f = tmp_path / "t" / cell.key / f"seed{seed}" / "run.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), "machine": m}))
    two = provenance(collect(spec, "t", tmp_path), "t", tmp_path)
    assert "cpu A (2 runs); cpu B (1 run)" in two.split("- Machine: ")[1].split("\n")[0]
    # the commit of each resume is named beside the runs' own (found in review: left out)
    from bnlab.rundir import git_commit
    commits = mixed.split("- Commit(s), at each start and resume: ")[1].split("\n")[0]
    assert f"`{git_commit()}`" in commits


def test_every_page_that_shows_a_jitter_column_says_what_it_is():
    """The words issue: a reader meets no undefined column. Each committed page whose table
    shows a von Neumann sd, churn floor or swing column defines it on the page."""
    from bnlab.lab.page import COLUMNS, column_terms
    from bnlab.paths import EXPERIMENTS

    pages = sorted(EXPERIMENTS.glob("*/table.md"))
    assert len(pages) > 10
    for path in pages:
        text = path.read_text()
        assert column_terms(text) == "", path  # nothing it shows is left undefined
        if "| swing" in text.lower():  # each page words its own swing (its window)
            assert "swing:" in text.lower(), path
    shown = "| cell | von Neumann sd (pts) | churn floor (pts) |\n|---|---|---|\n| bn | 1 | 1 |\n"
    said = column_terms(shown)
    assert said.startswith("Columns: Von Neumann sd: ") and "Churn floor: " in said
    assert column_terms(shown + "\n" + said) == ""
    assert {c for c, _ in COLUMNS} == {"von Neumann sd", "churn floor"}


def test_a_runs_config_reads_as_pyyamls_safe_loader_reads_it():
    """Run.cfg parses with libyaml where PyYAML has it: on committed runs of every data tag,
    the same dicts as yaml.safe_load (the pure-Python parser)."""
    import yaml

    from bnlab.paths import EXPERIMENTS

    runs = [sorted(t.glob("*/seed*/config.yaml"))[:20] for t in sorted(
        EXPERIMENTS.glob("runs*/*")) if t.is_dir()]
    files = [f for group in runs for f in group]
    assert len(files) >= 40
    assert [Run(f.parent, None).cfg for f in files] == \
        [yaml.safe_load(f.read_text()) for f in files]
