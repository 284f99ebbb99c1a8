"""table-jitter: the short protocol's table from runs' logs (history: no verdicts)."""

from __future__ import annotations

from bnlab.claims import jitter
from bnlab.lab.spec import load_spec
from bnlab.paths import ROOT
from conftest import build_table, fake_run


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
    out = tmp_path / "out" / "jitter"
    res = build_table(jitter.TABLE, tag, root, out.parent).by_label
    text = (out / "table.md").read_text()
    assert res["bn"].stat("swing").fmt() == "10.5 ± 0.5"
    assert "| bn | 3 | 30.0 ± 0.0 | 41.0 ± 1.0 | 10.5 ± 0.5 |" in text
    assert "| syncbn | 3 | 30.0 ± 0.0 | 31.0 ± 0.0 | 1.0 ± 0.0 |" in text
    assert "| ln | 1/3 (1 diverged) | - |" in text  # diverged: shown as such, not dropped
    assert "3 of 3" not in text and "7 of 38 finished" in text
    assert "the 7 of 38 runs finished so far) come to about 4 min" in text
    assert (out / "jitter.png").stat().st_size > 10_000
    assert jitter.TABLE.verdicts(None) == [] and jitter.TABLE.claims == ()
