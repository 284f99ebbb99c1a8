"""table-ranks: the table from runs' logs."""

from __future__ import annotations

from bnlab.claims import ranks
from conftest import build_table


def test_tables_without_runs_say_so(tmp_path):
    res = build_table(ranks.TABLE, "none", tmp_path / "runs", tmp_path / "out").by_label
    assert all(not c.runs for c in res.values())
    assert "No finished runs yet" in (tmp_path / "out" / "ranks" / "table.md").read_text()
