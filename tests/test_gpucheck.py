"""`make gpu-check`'s bookkeeping, on CPU: which K the values sweep packs, how the tests'
counts are read, the reordered values spec, a crashing step written down, and the commit a
copied tree records. (What it measures on a GPU comes from the GPU, never from a test.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpucheck  # noqa: E402


def test_the_values_sweep_packs_the_fastest_k_whose_runs_end_inside_the_slot():
    # runs/h by K; a values run takes K x 3600 / rate x 10 / 20 seconds
    rate = {1: 16.3, 2: 35.9, 4: 51.3, 8: 106.6, 16: 152.5}  # 16: 189 s a run, 8: 135 s
    assert gpucheck.pick_k(rate, 1.5 * 189) == 16
    assert gpucheck.pick_k(rate, 1.5 * 189 - 1) == 8
    assert gpucheck.pick_k(rate, 10) == min(rate, key=lambda k: k / rate[k])  # none fits
    assert gpucheck.pick_k({}, 1000) == 1


def test_the_tests_counts_come_from_the_junit_report(tmp_path):
    xml = tmp_path / "t.xml"
    xml.write_text('<testsuites><testsuite tests="13" failures="1" errors="0" skipped="2">'
                   "</testsuite></testsuites>")
    assert gpucheck.junit_counts(xml) == {"passed": 10, "failed": 1, "errors": 0, "skipped": 2}
    assert gpucheck.junit_counts(tmp_path / "none.xml") == {}


def test_the_values_spec_keeps_every_cell_and_runs_one_input_at_a_time(tmp_path):
    raw = yaml.safe_load(gpucheck.VALUES_SPEC.read_text())
    new = yaml.safe_load(gpucheck.values_spec(tmp_path).read_text())
    assert gpucheck.values_spec(tmp_path).parent.name == "values"
    strip = [{k: v for k, v in c.items() if k != "order"} for c in new["cells"]]
    gpu_only = raw["cells"] + raw["cuda_cells"]  # rule v6's bf16 cells: the GPU runs them
    assert strip == [{k: v for k, v in c.items() if k != "order"} for c in gpu_only]
    assert "cuda_cells" not in new and "cuda_cells" in raw
    order = {(c["input"], c.get("batch", 8)): c["order"] for c in new["cells"]}
    firsts = [order[(inp, 8)] for inp in gpucheck.VALUES_FIRST]
    assert firsts == sorted(firsts) and max(firsts) < min(order[k] for k in order if k[1] == 16)


def test_a_crashing_step_is_written_down_and_the_check_goes_on(tmp_path):
    c = gpucheck.Check(tmp_path, 1.0)
    c.step("no-such-step", "cpu", 60)
    c.record("next", {"ok": True, "said": "ran"}, 1.0)
    lines = (tmp_path / "summary.txt").read_text().splitlines()
    assert lines[0].startswith("FAIL no-such-step") and "crashed (exit 1)" in lines[0]
    assert lines[1] == "PASS next (1 s): ran"
    assert json.loads((tmp_path / "check.json").read_text())["no-such-step"]["ok"] is False
    assert "KeyError" in (tmp_path / "log.txt").read_text()


def test_a_copied_tree_records_the_commit_it_was_copied_from(monkeypatch):
    from bnlab.rundir import COPIED_FROM, git_commit

    monkeypatch.setenv(COPIED_FROM, "a9c58c9")
    assert git_commit() == "a9c58c9-copy"
    monkeypatch.delenv(COPIED_FROM)
    assert not (git_commit() or "").endswith("-copy")
