"""table-batch: the grid by images per rank and the rules of C2, L1."""

from __future__ import annotations

from bnlab.claims import batch
from bnlab.lab.spec import load_spec
from bnlab.paths import ROOT
from conftest import Means, build_table, fake_run


def test_l1_compares_only_sizes_where_both_rows_learned():
    accs = {"bn": {32: 30.0, 16: 35.0, 8: 39.5, 4: 33.0, 2: 16.4},
            "gn": {32: 10.8, 16: 9.0, 8: 31.8, 4: 37.7, 2: 40.6}}
    table = {f"{r} {b}": Means(a) for r, by in accs.items() for b, a in by.items()}
    v = batch.l1(table)
    assert v.verdict == "reproduced" and "from 8 to 2" in v.ours
    assert "gn at 32, gn at 16" in v.why and "quarter" not in v.why
    table["gn 16, lr / 4"] = Means(42.5)
    why = batch.l1(table).why
    assert "(not ruled on): final acc 42.5% at 16." in why
    # the rule was changed after its data was seen: the verdict says what the old rule gives
    assert why.endswith("the rule before it (32 to 2 images per rank, whether or not a row "
                        "learned) gives reproduced (bn 13.6, gn -29.8 points).")
    assert batch.l1(table).verdict == "reproduced"
    table["gn 8"] = Means(11.0)
    assert batch.l1(table).verdict == "not reproduced"


def test_the_batch_table_gives_each_columns_optimizer_steps_from_the_logs(tmp_path):
    root, tag = tmp_path / "runs", "cifar10-test"
    spec = load_spec(ROOT / "experiments/batch/sweep.yaml")
    cell = next(c for c in spec.cells if c.meta["row"] == "bn" and c.meta["col"] == 2)
    fake_run(root / tag / cell.key / "seed0", [30.0] * 25)
    build_table(batch.TABLE, tag, root, tmp_path / "out")
    text = (tmp_path / "out" / "batch" / "table.md").read_text()
    assert "| optimizer steps (from the logs) | - | - | - | - | 99 |" in text
