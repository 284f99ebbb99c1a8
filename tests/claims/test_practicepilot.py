"""table-practicepilot's rules on runs made up for the case: the reference's length (the
shortest whose doubling adds under a point), the rate (the best mean, no tie-break towards small
rates; one more rate past the ladder's edge) and the end accuracy they read."""

from __future__ import annotations

from pathlib import Path

from bnlab.claims import practicepilot
from bnlab.lab import choose
from bnlab.lab.plan import Cell
from bnlab.lab.results import CellResult, Run

RULES = choose.Rules.read(practicepilot.RULES)


def run(epochs: int, end: float, seed: int = 0) -> Run:
    """A finished run evaluated once an epoch, at 10% until its last tenth, `end` there."""
    rows = [{"epoch": e, "val/acc": end if e > 0.9 * epochs else 10.0}
            for e in range(1, epochs + 1)]
    return Run(Path(f"/nowhere/{epochs}/{seed}"), "completed",
               rows + [{"epoch": epochs, "train/loss": 1.0}], seed=seed)


def cell(fix: str, ends: list[float], epochs: int = 30, lr: float = 0.1, **meta) -> CellResult:
    c = Cell(f"{fix} {epochs} {lr}", [], [0, 1], cfg={"epochs": epochs},
             meta={"fix": fix, "lr": lr, **meta})
    return CellResult(c, [run(epochs, a, s) for s, a in enumerate(ends)], 2)


def lengths(ends: dict[int, list[float]]) -> list[CellResult]:
    return [cell("length", e, n, length=n) for n, e in ends.items()]


def test_end_accuracy_is_the_mean_over_the_last_tenth_of_training():
    r = run(30, 70.0)
    assert r.end_acc(30) == 70.0  # epochs 28, 29, 30
    rows = [{"epoch": e, "val/acc": float(e)} for e in range(1, 31)]
    assert Run(Path("/x"), "completed", rows).end_acc(30) == (28 + 29 + 30) / 3


def test_the_length_is_the_shortest_whose_doubling_adds_under_a_point():
    pick = practicepilot.length_choice(lengths({30: [70, 72], 60: [74, 74], 120: [74.5, 74.9]}),
                                       RULES)
    assert pick["state"] == "chosen" and pick["length"] == 60  # 30 -> 60 adds 3, 60 -> 120 0.7
    pick = practicepilot.length_choice(lengths({30: [74, 74], 60: [74.9, 74.9], 120: [80, 80]}),
                                       RULES)
    assert pick["length"] == 30


def test_a_length_ladder_that_never_flattens_says_so_and_takes_the_longest():
    pick = practicepilot.length_choice(lengths({30: [60, 60], 60: [65, 65], 120: [70, 70]}),
                                       RULES)
    assert pick["state"] == "not settled" and pick["length"] == 120


def test_the_length_waits_for_every_seed():
    cs = lengths({30: [70, 70], 60: [74], 120: []})
    assert practicepilot.length_choice(cs, RULES)["state"] == "undecided"


def test_the_best_mean_rate_wins_even_by_a_hair_and_an_edge_asks_for_one_more_rate():
    cells = [cell("gn", a, lr=lr) for lr, a in ((0.05, [60, 60]), (0.1, [65, 65]),
                                                (0.2, [65.2, 65.2]), (0.4, [50, 50]))]
    pick = choose.choose(cells, RULES)
    assert pick["state"] == "chosen" and pick["cell"].cell.meta["lr"] == 0.2  # not 0.1
    edge = [cell("gn", a, lr=lr) for lr, a in ((0.05, [60, 60]), (0.1, [62, 62]),
                                               (0.2, [63, 63]), (0.4, [64, 64]))]
    pick = choose.choose(edge, RULES)
    assert pick["state"] == "needs a rate" and pick["edge"] == 0.8  # x2, the rules' factor
