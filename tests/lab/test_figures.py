"""The plots' shared pieces."""

from __future__ import annotations

from bnlab.lab.spec import load_spec
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


def test_text_problems_finds_overlapping_ticks_and_text_off_the_canvas():
    from bnlab.lab.figures import plt, text_problems

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_xticks(range(4), [f"a long category name {i}" for i in range(4)])
    ax.set_title("a title far too long for a figure this narrow, running off its edges")
    problems = text_problems(fig)
    assert any("tick labels" in p and "overlap" in p for p in problems)
    assert any("leaves the canvas" in p for p in problems)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([0, 1], [0, 1])
    ax.set(title="fits", xlabel="x", ylabel="y")
    fig.tight_layout()
    assert text_problems(fig) == []
    plt.close(fig)


def test_labels_drawn_over_each_other_fail_the_report(tmp_path, capsys):
    """Text drawn on an axes over other such text is a problem, and a report whose figure has
    one exits 1 (after writing it), naming the figure."""
    from bnlab.lab import figures, make, table

    def plot(data, path):
        fig, ax = figures.plt.subplots()
        ax.text(0.5, 0.5, "BN 1.39x", transform=ax.transAxes)
        ax.text(0.5, 0.5, "SyncBN", transform=ax.transAxes)  # over the first
        figures.save(fig, path, "a figure")

    t = table.Table("overdrawn", ("X1",), lambda ctx: None, lambda d: "page", lambda d: [],
                    plot, spec=tmp_path / "none.yaml", block="x")
    code = make.main({"overdrawn": t}, ["overdrawn", "--report", "--experiments",
                                        str(tmp_path / "exp")])
    err = capsys.readouterr().err
    assert code == 1 and "overlaps" in err and "1 figure text problem" in err
    assert (tmp_path / "exp" / "overdrawn" / "overdrawn.png").is_file()  # written all the same


def test_save_checks_the_text_in_savefigs_own_draw_as_a_draw_of_its_own_finds_it(tmp_path):
    """save checks the text at the end of savefig's draw (one draw, not two): the problems it
    finds are those text_problems finds in a draw of its own, and the figure is written."""
    from bnlab.lab import figures

    def narrow():
        fig, ax = figures.plt.subplots(figsize=(3, 2))
        ax.set_xticks(range(4), [f"a long category name {i}" for i in range(4)])
        ax.text(0.5, 0.5, "BN 1.39x", transform=ax.transAxes)
        ax.text(0.5, 0.5, "SyncBN", transform=ax.transAxes)  # over the first
        return fig

    fig = narrow()
    fig.suptitle("a title far too long for a figure this narrow, running off its edges")
    fig.tight_layout()
    alone = figures.text_problems(fig)
    figures.plt.close(fig)
    figures.PROBLEMS.clear()
    figures.save(narrow(), tmp_path / "narrow.png", "a title far too long for a figure this "
                 "narrow, running off its edges")
    found = [p for f, p in figures.PROBLEMS if f == str(tmp_path / "narrow.png")]
    figures.PROBLEMS.clear()
    assert found == alone and len(alone) >= 3  # overlapping ticks, labels, the title's edges
    assert (tmp_path / "narrow.png").stat().st_size > 0
