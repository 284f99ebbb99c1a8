"""The A/A control (bnlab/lab/identity.py) and the pages' kernels lines (bnlab/lab/page.py) on
runs made up for the case."""

from __future__ import annotations

from pathlib import Path

from bnlab.lab import identity, page
from bnlab.lab.plan import Cell
from bnlab.lab.results import CellResult, Run


def cfg(norm: str, world: int, b: int, lr: float = 0.1) -> dict:
    return {"norm": {"kind": norm, "eps": 1e-5, "momentum": 0.1,
                     **({"sync_group": 0} if norm == "syncbn" else {})},
            "dist": {"simulate": world, "threads": 1}, "batch_per_gpu": b, "epochs": 10,
            "optim": {"lr": lr}, "seed": 0}


def run(seed: int, losses: list[float], cap: str | None = None, vendor: str | None = None) -> Run:
    rows = [{"step": 50 * (i + 1), "train/loss": v, "images_per_s": 100.0 + i}
            for i, v in enumerate(losses)]
    info = {"floats": {"cpu_capability": cap, "cpu": {"vendor": vendor}}} if cap else {}
    return Run(Path(f"/nowhere/{seed}"), "completed", rows, info=info, seed=seed)


def cell(label: str, c: dict, runs: list[Run]) -> CellResult:
    return CellResult(Cell(label, [], [r.seed for r in runs], cfg=c), runs, len(runs))


def test_syncbn_over_all_ranks_pairs_with_bn_on_one_rank_of_the_same_images_only():
    sync = cell("syncbn 4x2", cfg("syncbn", 4, 2), [])
    ref = cell("bn 1x8", cfg("bn", 1, 8), [])
    other = cell("bn 1x8 lr", cfg("bn", 1, 8, lr=0.2), [])
    half = cell("bn 1x4", cfg("bn", 1, 4), [])
    assert identity.pairs([sync, ref, other, half]) == [(sync, ref)]


def test_the_control_says_equal_or_the_first_difference_with_each_sides_kernels():
    sync = cell("syncbn 4x2", cfg("syncbn", 4, 2),
                [run(0, [2.4, 2.3], "AVX2"), run(1, [2.4, 2.31], "AVX2")])
    ref = cell("bn 1x8", cfg("bn", 1, 8), [run(0, [2.4, 2.3], "AVX2"), run(1, [2.4, 2.3])])
    text = "\n".join(identity.lines([sync, ref]))
    assert "| 0 | equal at all 2 logged values | AVX2 | AVX2 |" in text  # timings not compared
    assert "| 1 | differ from step 100 (train/loss: 2.31 against 2.3) | AVX2 | not recorded |" \
        in text


def test_the_page_counts_runs_by_kernels_and_names_seeds_paired_across_them():
    a = cell("a", cfg("bn", 1, 8), [run(0, [2.4], "AVX2"), run(1, [2.4])])
    b = cell("b", cfg("bn", 4, 2), [run(0, [2.4], "AVX512", "GenuineIntel"),
                                    run(1, [2.4], "AVX512", "AuthenticAMD")])
    runs = [r for c in (a, b) for r in c.runs]
    assert page.kernels_line(runs) == (
        "- CPU kernels (`floats.cpu_capability` and `cpu.vendor` in run.json): AVX2: 1 run; "
        "AVX512 on AMD: 1 run; AVX512 on Intel: 1 run; not recorded: 1 run, made before runs "
        "recorded it")
    head, line = page.crossed([a, b])
    assert head.startswith("- Paired seeds across kernels (a gap paired on such a seed")
    assert line == "  - seed 0: AVX2 in a, AVX512 on Intel in b"  # seed 1 not recorded: not crossed
    more = [cell(f"c{i}", cfg("bn", 1, 8), [run(0, [2.4], "AVX512", "GenuineIntel")])
            for i in range(3)]
    _, line = page.crossed([a, b, *more])  # the most common kernels' cells are counted
    assert line == "  - seed 0: AVX2 in a, AVX512 on Intel in the other 4 cells"


def test_a_results_page_counts_the_kernels_of_the_runs_it_names_or_of_its_machine(tmp_path):
    import json

    for name, cap in (("bn-4x2/seed1", "AVX2"), ("syncbn-4x2/seed1", None)):
        d = tmp_path / "cifar10-5085" / name
        d.mkdir(parents=True)
        floats = {"cpu_capability": cap, "cpu": {"vendor": "AuthenticAMD"}} if cap else None
        (d / "run.json").write_text(json.dumps({"floats": floats} if floats else {}))
    res = {"tag": "cifar10-5085",  # a run by path, and runs by label (each an entry)
           "cells": {"bn": {"run": "bn-4x2/seed1"}},
           "runs": {"syncbn": {"run": "syncbn-4x2/seed1"}, "bn": {"run": "bn-4x2/seed1"}}}
    assert page.results_kernels(res, tmp_path) == (
        "- CPU kernels (`floats.cpu_capability` and `cpu.vendor` in run.json): AVX2 on AMD: 1 "
        "run; not recorded: 1 run, made before runs recorded it")  # each run once
    measured = {"floats": {"cpu_capability": "AVX512", "cpu": {"vendor": "GenuineIntel"}}}
    assert page.results_kernels(measured, tmp_path).endswith(": AVX512 on Intel")
    assert page.results_kernels({}, tmp_path).endswith(
        "not recorded, measured before results recorded them")


def test_a_results_page_counts_each_run_once_however_its_results_name_it(tmp_path):
    """table-evalmode's results name one run twice: by its path under the runs folder and, as
    an older measure wrote it, by another checkout's absolute path; it counts once, read here.
    A named run without run.json is said as not found, not as made before it was recorded."""
    import json

    from bnlab.paths import EXPERIMENTS

    res = json.loads((EXPERIMENTS / "evalmode" / "results.json").read_text())
    assert res["moves"]["run"].startswith("/") and "3 runs" in page.results_kernels(res)
    gone = {"tag": "t", "runs": ["nowhere/seed0"]}
    assert page.results_kernels(gone, tmp_path).endswith("in run.json): run.json not found: 1 run")
