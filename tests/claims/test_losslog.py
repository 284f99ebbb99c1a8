"""figure-losslog (C13): one run's loss curve logged two ways."""

from __future__ import annotations

import json

import pytest

from bnlab.claims import losslog
from bnlab.errors import BnlabError
from bnlab.jitter import step_sd
from bnlab.lab.spec import load_spec
from bnlab.paths import ROOT


def test_losslog_compares_the_two_curves_of_one_run(tmp_path):
    from dataclasses import replace

    from bnlab.lab.readme import write_verdicts
    from bnlab.lab.table import Context, build

    spec = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    cell = next(c for c in spec.cells if c.label == "bn")
    d = tmp_path / "runs" / "t" / cell.key / "seed0"
    d.mkdir(parents=True)
    sparse = [2.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0, 2.0]
    mean = [2.0, 2.2, 2.0, 2.2, 2.0, 2.2, 2.0, 2.1]
    (d / "metrics.jsonl").write_text("".join(
        json.dumps({"step": 25 * (i + 1), "train/loss": m, "train/loss_rank0": s}) + "\n"
        for i, (s, m) in enumerate(zip(sparse, mean, strict=True))))
    table = replace(losslog.TABLE, load=lambda ctx: losslog.load(ctx, ["bn"], 0))
    ctx = Context(table, tmp_path, tmp_path / "runs", "t")
    write_verdicts(ctx.readme, table.marker, [(table, build(table, ctx))])
    text = (tmp_path / "losslog" / "table.md").read_text()
    ratio = step_sd(sparse) / step_sd(mean)
    assert f"{ratio:.1f}x" in text and "**C13 verdict: reproduced.**" in text
    assert (tmp_path / "losslog" / "losslog.png").stat().st_size > 0
    assert "<!-- c13:begin -->" in (tmp_path / "README.md").read_text()
    with pytest.raises(BnlabError, match="run `make table-jitter` first"):
        build(replace(table, load=lambda ctx: losslog.load(ctx, ["syncbn"], 0)), ctx)
