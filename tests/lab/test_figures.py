"""The plots' shared pieces."""

from __future__ import annotations

from bnlab.lab.sweep import load_spec
from bnlab.paths import ROOT
from conftest import fake_run


def test_the_precisebn_row_is_plotted_after_each_recalibration_not_as_a_second_ema_curve(
        tmp_path):
    import matplotlib.pyplot as plt

    from bnlab.lab.figures import precise_points
    from bnlab.lab.results import CellResult, finished_run

    spec = load_spec(ROOT / "experiments/jitter/sweep.yaml")
    cell = next(c for c in spec.cells if "PreciseBN" in c.label)
    fake_run(tmp_path / "p", [30.0] * 25, precise=25.0)
    fake_run(tmp_path / "e", [30.0] * 25)
    ax = plt.figure().add_subplot()
    assert not precise_points(ax, CellResult(cell, [finished_run(tmp_path / "e", 0)], 3))
    assert precise_points(ax, CellResult(cell, [finished_run(tmp_path / "p", 0)], 3))
    (line,) = ax.get_lines()[:1]
    assert list(line.get_ydata()) == [25.0] and "after each recalibration (n=1)" in \
        ax.get_legend_handles_labels()[1][0]
    plt.close("all")
