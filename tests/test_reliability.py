"""Every bad input in docs/reliability.md: one sentence, no traceback, non-zero exit,
nothing overwritten, no half-made run directory, and exactly what the document says."""

from __future__ import annotations

import json

import pytest
from reliability import CASES, FAULTS, documented, run_case

from conftest import needs_cifar, run_dirs


@needs_cifar
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_bad_input_is_refused_as_documented(case, tmp_path):
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code, msg, text = run_case(case, tmp_path)
    assert code == case.code, text[-2000:]
    assert msg.startswith("bnlab: error: "), text[-2000:]
    assert "Traceback" not in text and msg.count(". ") <= 1
    documented_cell = documented().get(case.name)
    assert documented_cell == f"{code}: {msg}", (
        "docs/reliability.md is out of date; run `python tests/reliability.py`")
    for p, content in before.items():  # nothing that was there is changed...
        if p.exists() or "crashed" not in str(p):
            assert p.read_bytes() == content, p
    made = [d for d in run_dirs(tmp_path) if d.name not in ("done", "crashed")]
    assert made == []  # ...and no new run directory looks like a result
    out = tmp_path / "out"
    assert not out.exists() or not any(p.is_file() for p in out.rglob("*"))


def test_every_fault_test_exists():
    import importlib
    import sys
    from pathlib import Path

    for _, test, _ in FAULTS:
        path, name = test.split("::")  # a file under tests/, as pytest names it
        folder = str((Path(__file__).parent / path).parent)
        if folder not in sys.path:  # as pytest imports it (already imported in a full run)
            sys.path.insert(0, folder)
        module = importlib.import_module(Path(path).stem)
        assert callable(getattr(module, name)), test
    assert json.dumps(documented())  # the document parses
