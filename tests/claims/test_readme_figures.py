"""The figures the README shows carry their message: drawn from the committed runs, each has a
title that says what it found, labelled axes in plain units, and text that reads cleanly
(bnlab.lab.figures.text_problems: nothing overlaps, nothing leaves the canvas)."""

from __future__ import annotations

import re

import pytest

from bnlab.claims import lr, practice, recover, values
from bnlab.claims.values import figure as values_figure
from bnlab.lab import figures, table
from bnlab.paths import ROOT

# figure -> (its table's module, where it calls save, what its title must say)
SHOWN = {"lr.png": (lr, lr, r"^BN jitters [\d.]+x as much as SyncBN where SyncBN is steady"),
         "values.png": (values, values_figure, r"^BN breaks at "),
         "recover.png": (recover, recover, r"^What to use instead of BN at 4 ranks x 2"
                         r"(\nmost recovered on [^:\n]+: [^\n]+, "
                         r"(recovers|partly|unclear|no better))+$"),  # each with its state
         "practice.png": (practice, practice,
                          r"^(BN breaks at [\d, and]+ images per rank|BN holds at every "
                          r"per-rank batch); GroupNorm is \w+|runs to come\)$")}
# practice.png takes recover.png's place once table-practice's finding replaces table-recover's
EITHER = ("recover.png", "practice.png")


def test_the_readme_shows_exactly_these_figures():
    readme = (ROOT / "README.md").read_text()
    shown = re.findall(r"!\[\w+\]\(experiments/\w+/(\w+\.png)\)", readme)
    assert sorted(set(shown) - set(EITHER)) == sorted(set(SHOWN) - set(EITHER))
    assert len(set(shown) & set(EITHER)) == 1 and len(shown) == len(set(shown))


def test_a_figure_follows_its_tables_finding():
    from bnlab.lab.readme import shown_figures
    from bnlab.lab.table import Finding

    tables = [lr.TABLE, values.TABLE, recover.TABLE, practice.TABLE]
    before = [Finding("BN breaks.", "values"), Finding("Fix A.", "recover"),
              Finding("C1.", "lr")]
    assert shown_figures(tables, before) == ["experiments/lr/lr.png",
                                             "experiments/values/values.png",
                                             "experiments/recover/recover.png"]
    after = [Finding("BN breaks.", "values"), Finding("Fix B.", "practice",
                                                    replaces=("recover", "converge")),
             Finding("C1.", "lr")]
    assert shown_figures(tables, after)[-1] == "experiments/practice/practice.png"
    assert "experiments/recover/recover.png" not in shown_figures(tables, after)
    quiet = [Finding("BN breaks.", "values"), Finding("C1.", "lr")]  # recover's: to come
    assert "experiments/recover/recover.png" in shown_figures(tables, quiet)  # it stays
    assert "experiments/practice/practice.png" not in shown_figures(tables, quiet)


def test_the_readme_shows_what_its_findings_give(monkeypatch):
    """The README's figures are what shown_figures gives for the findings it shows."""
    from bnlab.lab import readme
    from bnlab.lab.table import Finding

    text = (ROOT / "README.md").read_text()
    shown = re.findall(r"!\[\w+\]\((experiments/\w+/\w+\.png)\)", text)
    told = re.findall(r"\n\d+\. .*?\(\[table-(\w+)\]", text)  # each numbered finding's table
    found = [Finding("", t, replaces=practice.REPLACES if t == "practice" else ())
             for t in told]
    assert shown == readme.shown_figures([lr.TABLE, values.TABLE, recover.TABLE,
                                          practice.TABLE], found)


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_each_readme_figure_says_its_message_in_plain_units(name, monkeypatch, tmp_path):
    module, where, title = SHOWN[name]
    drawn = []

    def keep(fig, path, head=None, **kw):  # what save would write, kept to look at
        fig.suptitle(head)
        fig.tight_layout()
        drawn.append((head, [(a.get_title(), a.get_xlabel(), a.get_ylabel()) for a in fig.axes],
                      figures.text_problems(fig)))
        figures.plt.close(fig)

    monkeypatch.setattr(where, "save", keep)
    t = module.TABLE
    data = t.load(table.Context(t)) if t.load is not table.runs_data else \
        table.runs_data(table.Context(t))
    t.plot(data, tmp_path / name)
    (head, axes, problems) = drawn[0]
    assert re.search(title, head), head
    assert problems == []
    for ax_title, xlabel, ylabel in axes:
        assert ax_title and xlabel and ylabel, (ax_title, xlabel, ylabel)
        assert "²" not in ylabel + xlabel and "crossover" not in head + ax_title
