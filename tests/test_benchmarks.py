"""The benchmark's bookkeeping and docs/performance.md rendering (no timing is asserted:
figures come from `make bench`, never from tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench  # noqa: E402
import perfdoc  # noqa: E402

MACHINE = {"machine": "Test CPU, 2 cores, 4 GiB memory, no GPU", "host": "h",
           "python": "3.11", "torch": "2.13.0"}


def row(section: str, value: float, ref: float | None = None, target: str = "",
        met: bool | None = None) -> dict:
    return {"bench": section, "section": section, "what": f"{section} figure", "value": value,
            "unit": "s", "ref": ref, "ref_what": "reference", "ratio": value / ref if ref else None,
            "target": target, "met": met, "note": ""}


def run(sections: list[str], quick: bool = False) -> dict:
    return {"command": "python benchmarks/bench.py", "commit": "abc", "date": "2026-11-22",
            "quick": quick, "sections": sections, "wall_s": 60.0}


def test_a_partial_run_replaces_only_its_sections(tmp_path):
    out = tmp_path / "h.json"
    bench.save(out, MACHINE, run(["overhead", "sim"]), [row("overhead", 1.0), row("sim", 2.0)])
    bench.save(out, MACHINE, run(["sim"]), [row("sim", 3.0)])
    res = json.loads(out.read_text())
    assert [(r["section"], r["value"], r["run"]) for r in res["rows"]] == \
        [("overhead", 1.0, 0), ("sim", 3.0, 1)]
    assert [r["id"] for r in res["runs"]] == [0, 1]
    bench.save(out, MACHINE, run(["overhead", "sim"]), [row("overhead", 4.0), row("sim", 5.0)])
    res = json.loads(out.read_text())
    assert len(res["runs"]) == 1 and {r["run"] for r in res["rows"]} == {res["runs"][0]["id"]}


def test_results_of_another_machine_are_kept_aside(tmp_path):
    out = tmp_path / "h.json"
    bench.save(out, MACHINE, run(["sim"]), [row("sim", 2.0)])
    other = {**MACHINE, "machine": "Other CPU"}
    bench.save(out, other, run(["sim"]), [row("sim", 9.0)])
    assert json.loads(out.with_name("h.json.prev").read_text())["rows"][0]["value"] == 2.0
    assert json.loads(out.read_text())["rows"][0]["value"] == 9.0


def test_performance_page_shows_targets_missed_and_quick_runs(tmp_path, monkeypatch):
    out = tmp_path / "h.json"
    bench.save(out, MACHINE, run(["data", "syncbn"], quick=True),
               [row("data", 0.002, 0.1, "<= 3%", True),
                row("syncbn", 1.6, 1.0, "<= 1.15x", False)])
    monkeypatch.setattr(perfdoc, "RUNS", tmp_path / "no-runs")
    page = perfdoc.render([json.loads(out.read_text())])
    assert "| data figure | 0.002 s | reference (0.1) | 2.00% | <= 3% | yes |" in page
    assert "| syncbn figure | 1.6 s | reference (1) | 1.60x | <= 1.15x | **no** |" in page
    assert "Missed: syncbn figure (1.60x against <= 1.15x)" in page
    assert "quick: code paths only" in page
    assert "No GPU figures yet" in page


def _sweep_run(root: Path, cell: str, seed: int, wall: float, **rec) -> None:
    d = root / "cifar10-9" / cell / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"host": rec.pop("host", "h")}))
    (d / "sweep.json").write_text(json.dumps({"cell": "bn", "rc": 0, "wall_s": wall,
                                              "threads": 1, **rec}))


def test_observed_sweep_throughput_comes_from_the_runs_records(tmp_path):
    (tmp_path / "cifar10-9").mkdir()
    (tmp_path / "cifar10-9" / "hosts.json").write_text(
        json.dumps({"h": ["X, 2 cores", "Y, 2 cores"], "g": ["X, 2 cores", "Z, 4 cores"]}))
    _sweep_run(tmp_path, "resnet18-bn-4x2-abc", 3, 700.0, host="g")  # cores unknown: left out
    _sweep_run(tmp_path, "resnet18-bn-4x2-abc", 0, 300.0)  # predates `jobs`: 2 cores / 1
    _sweep_run(tmp_path, "resnet18-bn-4x2-abc", 1, 500.0, jobs=2)
    _sweep_run(tmp_path, "resnet18-bn-4x2-abc", 2, 9000.0, jobs=2, launches=2)  # resumed
    lines = perfdoc.observed_sweeps(tmp_path)
    assert "| bn (resnet18-bn-4x2) | 1 | 2 | 400 s | 300-500 s | 2 | 18.0 |" in lines


@pytest.mark.slow  # CI time (14 s); make test-slow runs it
def test_unknown_section_is_one_sentence():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/bench.py"), "--only", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("bench: error: unknown section(s) nope; choose from")
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("name", list(bench.SECTIONS))
def test_every_section_says_what_it_measures(name):
    assert bench.SECTIONS[name].__doc__ and name in perfdoc.WHY


def test_an_option_is_called_worth_it_only_where_it_was_faster():
    rows = [row("compile", 2.0, 1.0), row("compile", 0.5, 1.0)]
    rows[0]["what"], rows[1]["what"] = "compile, 8 images", "compile, 128 images"
    text = perfdoc.option_verdict("compile", rows)
    assert "slower than eager for 8 images (2.00x); faster than eager for 128 images" in text
    assert text.endswith("Off by default; train.py compile=true turns it on: it pays only at "
                         "the settings where it is faster.")
    assert perfdoc.option_verdict("compile", rows[:1]).endswith("did not pay at any measured "
                                                                "setting.")


@pytest.mark.slow  # three worker processes train (40-100 s); make test-slow runs it
def test_packing_measures_k_runs_side_by_side_and_names_the_device():
    """The GPU section's runs-per-hour rows, exercised on the CPU: every K gets a measured step
    and a runs/h row against K = 1."""
    b = bench.Bench(quick=True)
    b.current = "gpu"
    bench.packing(b, "cpu", ks=(1, 2))
    steps = [r for r in b.rows if r["unit"] == "s/step"]
    rates = [r for r in b.rows if r["unit"] == "runs/h"]
    assert [r["what"] for r in steps] == ["CPU: 1 run(s) side by side, step",
                                          "CPU: 2 run(s) side by side, step"]
    assert all(r["value"] > 0 for r in steps + rates)
    assert rates[0]["ratio"] == 1.0 and rates[1]["ref"] == rates[0]["value"]


def test_the_local_syncbn_collectives_replace_the_ones_syncbn_calls(monkeypatch):
    """The syncbn bench's "without communication" row: SyncBN's own collectives (the module
    it calls them through) are replaced, so that row times no communication."""
    import measure
    import torch

    import bnlab.syncbn

    monkeypatch.setattr(bnlab.syncbn, "tdist", bnlab.syncbn.tdist)  # given back afterwards
    measure._local_syncbn_collectives()
    assert bnlab.syncbn.tdist is not torch.distributed
    out = [torch.zeros(2), torch.zeros(2)]
    bnlab.syncbn.tdist.all_gather(out, torch.ones(2))
    assert all(torch.equal(o, torch.ones(2)) for o in out)


def test_the_fixes_benchmark_runs_table_recover_s_fixes_as_its_spec_does():
    """Each fix the bench times is a fix of table-recover's spec (its page finds the row by
    that name), configured as the spec's cell on resnet20; bn + PreciseBN steps as bn."""
    import yaml

    spec = yaml.safe_load((ROOT / "experiments" / "recover" / "sweep.yaml").read_text())
    cells = {c["fix"]: c["overrides"] for c in spec["cells"] if c["input"] == "resnet20"}
    assert set(bench.FIX_NORMS) == set(cells) - {"reference", "bn", "precise"}
    for fix, (_, kind, keys) in bench.FIX_NORMS.items():
        assert f"norm={kind}" in cells[fix], fix
        for k, v in keys.items():
            if fix != "frozen_bn":  # timed once frozen (freeze_after 0); the spec freezes later
                assert f"norm.{k}={str(v).lower()}" in cells[fix], (fix, k)
