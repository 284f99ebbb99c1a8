"""The practitioners' reports as cases (examples/cases/): each reproduces its symptom with plain
PyTorch, then bnlab names the cause and its fix works."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from conftest import ROOT

# case script -> (what bnlab's line must name, the fixed line's pattern)
CASES = {
    "ranks_disagree.py": (r"[Tt]he ranks' running statistics disagree by up to [0-9.]+ .*"
                          r"bnlab\.sync_bn_stats\(model\)", r"differ by up to 0$"),
    "accumulation.py": (r"gradient accumulation \(4 micro-batches a step\) does not enlarge "
                        r"BN's batch", r"gradient is [0-9.e-]+ \(relative\)"),
    "uneven_batches.py": (r"BatchNorm's on the concatenated batch within [0-9.e-]+$",
                          r"every rank's running mean that of rank 0's images within "
                          r"(0|[0-9.]+e-0[6-9])$"),
    "precise_bn_per_rank.py": (r"[Tt]he ranks' running statistics disagree by up to [0-9.]+",
                               r"bnlab\.precise_bn\(model, batches\) they differ by up to 0$"),
    "subgroups.py": (r"the process_group given does not hold this rank \(2\): every rank must "
                     r"create every group", r"BatchNorm's on its group's 4 images within "
                     r"(0|[0-9.]+e-0[6-9])$"),
    "eval_collectives.py": (r"issues 1 collective\(s\), _broadcast_coalesced x1 \(DDP's "
                            r"buffer sync\): ranks that evaluate different numbers of batches "
                            r"hang", r"issues 0 and 0 collectives"),
}


@pytest.mark.slow  # CI time (about 12 s a case: 2 gloo processes); make test-slow runs them
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_shows_the_symptom_and_bnlab_names_its_cause(case, tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "cases" / case)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = {ln.split(": ", 1)[0]: ln.split(": ", 1)[1] for ln in r.stdout.splitlines()
             if ln.startswith(("symptom: ", "bnlab: ", "fixed: "))}
    cause, fixed = CASES[case]
    assert set(lines) == {"symptom", "bnlab", "fixed"}, r.stdout
    assert re.search(cause, lines["bnlab"]), lines["bnlab"]
    assert re.search(fixed, lines["fixed"]), lines["fixed"]
    assert not r.stderr.strip(), r.stderr  # nothing else printed: no warning, no traceback


def test_every_case_script_is_tested_and_in_the_docs_table():
    scripts = {p.name for p in (ROOT / "examples" / "cases").glob("*.py")}
    assert scripts == set(CASES)
    table = (ROOT / "docs" / "library.md").read_text()
    for name in scripts:
        assert f"examples/cases/{name}" in table


def test_a_case_whose_comparison_needs_a_missing_package_says_so_in_one_line(tmp_path):
    """precise_bn_per_rank.py without fvcore: one line naming the package, exit status 2, no
    traceback."""
    case = ROOT / "examples" / "cases" / "precise_bn_per_rank.py"
    code = ("import runpy, sys; sys.modules['fvcore'] = None; "  # import fvcore then fails
            f"sys.path.insert(0, {str(case.parent)!r}); "
            f"runpy.run_path({str(case)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "needs fvcore; install it" in r.stderr, r.stderr
