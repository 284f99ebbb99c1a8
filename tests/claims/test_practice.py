"""table-practice on runs made up for the case: its spec composes as train.py would, bn breaks
and GroupNorm stays flat by its rules, each fix's state and share at 8 x 2, and its page and
figure build with and without runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bnlab.claims import practice
from bnlab.errors import BnlabError
from bnlab.lab import readme
from bnlab.lab.plan import Cell
from bnlab.lab.results import CellResult, Run
from bnlab.lab.spec import spec_from
from bnlab.lab.table import Finding, RunsData, Verdict

RATES = {"gn": 0.2, "gnws": 0.1, "evonorm": 0.4}


@pytest.fixture(scope="module")
def spec():
    """The spec at 60 epochs, composed once (19 cells through Hydra)."""
    return spec_from({"title": "t", "experiment": "practice", "seeds": [0, 1, 2],
                      "cells": practice.spec_cells(60, RATES)}, Path("sweep.yaml"))


def test_the_spec_holds_every_cell_in_running_order_and_composes_as_train_py_would(spec):
    cells = practice.spec_cells(60, RATES)
    assert len(cells) == 1 + 8 + 2 + 2 + 3 + 3
    assert [c["order"] for c in cells] == sorted(c["order"] for c in cells)
    assert {c["per_rank"] for c in cells if c["order"] == 0} == {16, 2}  # reference, then 8 x 2
    assert {c["per_rank"] for c in cells if c["order"] == 2} == {4}  # 8 x 4 before the longer runs
    assert all(c["longer"] for c in cells if c["order"] == 3)  # then gn at twice the length
    assert {c["per_rank"] for c in cells if c["order"] == 4} == {8}  # 8 x 8 last: cut first
    cfg = {c.label: c.cfg for c in spec.cells}
    assert cfg["bn 8x16"]["optim"]["lr"] == 0.1 and cfg["bn 8x16"]["dist"]["simulate"] == 8
    assert cfg["gn 8x2"]["optim"]["lr"] == 0.2 and cfg["gn 8x2"]["norm"]["groups"] == 8
    assert cfg["gn 8x2 (120 epochs)"]["epochs"] == 120
    brn = cfg["brn 8x2"]["norm"]
    assert brn["r_max"] == 1.5 and brn["ramp_of_run"]["r_ramp"] == 0.25
    assert cfg["frozen_bn 8x2"]["norm"]["freeze_after"] == 30
    assert cfg["precise 8x2"]["precise_bn"]["before_eval"] is True
    assert cfg["evonorm 8x2"]["norm"]["placement"] == "norm_act"
    assert cfg["syncbn4 8x2"]["norm"]["sync_group"] == 4
    assert all(c["model"]["zero_init_residual"] and not c["optim"]["decay_norms"]
               for c in cfg.values())
    assert len({c.key for c in spec.cells}) == len(cells)  # each cell its own identity


def test_the_spec_waits_for_every_pilot_choice(monkeypatch):
    from bnlab.claims import practicepilot

    monkeypatch.setattr(practicepilot, "choices", lambda d: {
        "length": {"state": "chosen", "length": 60}, "gn": {"state": "undecided"}})
    monkeypatch.setattr(practice.table, "runs_data", lambda ctx: None)
    with pytest.raises(BnlabError, match="the pilot has not chosen everything yet: gn"):
        practice.pilot_choices()


def run(end: float, seed: int, epochs: int = 30, b: int = 2, diverged: bool = False) -> Run:
    rows = [{"epoch": e, "val/acc": end if e > 0.9 * epochs else 20.0}
            for e in range(1, epochs + 1)]
    rows.append({"epoch": epochs, "train/loss": 1.0, "train_epoch/loss": 0.5})
    return Run(Path(f"/nowhere/{end}/{seed}"), "diverged" if diverged else "completed", rows,
               info={"steps_per_epoch": 40,  # resnet20's last stage: 8 x 8 values an image
                     "bn_values_per_channel": {"layers.0.bn1": 1024 * b,
                                               "layers.8.bn2": 64 * b}}, seed=seed)


def cell(fix: str, b: int, ends: list[float], longer: bool = False,
         diverged: tuple[int, ...] = ()) -> CellResult:
    c = Cell(f"{fix} 8x{b}" + (" longer" if longer else ""),
             ["norm.groups=8"] if fix in practice.FREE else [], [0, 1, 2],
             cfg={"epochs": 30}, meta={"fix": fix, "per_rank": b, "lr": 0.1, "longer": longer})
    return CellResult(c, [run(a, s, b=b, diverged=s in diverged) for s, a in enumerate(ends)],
                      3)


def swap(cells: list[CellResult], *new: CellResult) -> list[CellResult]:
    """`cells` with each of `new` in place of the cell of its label."""
    labels = {c.cell.label for c in new}
    return [c for c in cells if c.cell.label not in labels] + list(new)


def made_up(lost_at: tuple[float, float, float] = (0.4, 3.0, 10.0)) -> list[CellResult]:
    """bn loses (by default) 0.4, 3 and 10 points at 8, 4 and 2 per rank; gn sits 2 points
    under bn at 16 and stays there; gnws drops 5 at 2; syncbn4 gets most of bn's loss back,
    frozen BN none."""
    cells = [cell("bn", 16, [80.0, 81.0, 79.5])]
    for b, lost in zip((8, 4, 2), lost_at, strict=True):
        cells.append(cell("bn", b, [80.0 - lost, 81.3 - lost, 79.2 - lost]))
    for b in practice.BATCHES:
        cells.append(cell("gn", b, [78.0, 79.1, 77.4]))
        cells.append(cell("gnws", b, [79.0 - (5 if b == 2 else 0), 79.6 - (5 if b == 2 else 0),
                                      78.9 - (5 if b == 2 else 0)]))
    cells += [cell("syncbn4", 2, [79.0, 80.2, 78.1]), cell("frozen_bn", 2, [69.5, 71.4, 69.0]),
              cell("gn", 16, [79.0, 80.0, 78.5], longer=True)]
    return cells


WIDE = cell("bn", 8, [80.0, 81.0, 73.8])  # gaps 0, 0 and 5.7 to bn at 8 x 16: unclear


def test_bn_breaks_where_its_gap_is_2_points_or_more_with_its_interval_above_0():
    states = {b: s for b, (_, s) in practice.bn_states(made_up()).items()}
    assert states == {8: "holds", 4: "breaks", 2: "breaks"}


def test_groupnorm_is_flat_where_no_gap_to_its_own_16_reaches_a_loss_of_2_points():
    assert practice.flatness(made_up(), "gn")[0] == "flat"
    verdict, each = practice.flatness(made_up(), "gnws")
    assert verdict == "drops" and each[2][1] == "drops" and each[8][1] == "flat"


def test_a_norm_higher_at_fewer_images_per_rank_counts_as_flat_and_the_page_says_so(
        spec, tmp_path):
    """Rule `flat` bounds a loss only: gnws 2 points higher at 8 x 2 than at its own 8 x 16 is
    flat, and the page names that gain beside the steps each run took."""
    cells = swap(made_up(), cell("gnws", 2, [81.0, 81.6, 80.9]))
    verdict, each = practice.flatness(cells, "gnws")
    assert verdict == "flat" and each[2][0]["gap"] == pytest.approx(-2.0)
    md = practice.render(practice.Practice(RunsData(spec, cells, "cifar10-5085", tmp_path,
                                                    tmp_path)))
    assert ("Ends higher than at its own 8 x 16 (a negative gap): GroupNorm + WS at 8 x 2, -2.0 "
            "(-2.0 to -2.0). Rule flat bounds a loss only, so a gain counts as flat; a run takes "
            "1,200 optimizer steps at 8 x 16, 1,200 optimizer steps at 8 x 8") in md
    assert "(30 epochs each: fewer images per rank make more, smaller steps over the same " \
        "epochs)." in md  # why the steps differ
    assert "Ends higher than at its own" not in practice.render(practice.Practice(RunsData(
        spec, made_up(), "cifar10-5085", tmp_path, tmp_path)))


def test_each_fix_at_8x2_gets_table_recovers_state_and_its_share_of_bns_loss():
    cells = made_up()
    sync = practice.fix_at_two(cells, practice.find(cells, "syncbn4", 2))
    assert sync["state"] == "recovers" and sync["share"][0] == pytest.approx(0.9, abs=0.05)
    assert sync["share"][1] < sync["share"][0] < sync["share"][2] < 1.0  # its bootstrap interval
    frozen = practice.fix_at_two(cells, practice.find(cells, "frozen_bn", 2))
    assert frozen["state"] == "no better"
    assert practice.fix_at_two(cells, practice.find(cells, "gn", 2))["state"] == "partly"


def test_a_gap_of_exactly_2_points_breaks_and_one_under_2_with_a_wide_interval_is_unclear():
    at_two = swap(made_up(), cell("bn", 8, [78.0, 79.0, 77.5]))  # 2.0 on every seed
    assert practice.bn_states(at_two)[8][1] == "breaks"
    g, state = practice.bn_states(swap(made_up(), WIDE))[8]
    assert g["gap"] < 2 and g["hi"] > 4 and g["lo"] < 0 and state == "unclear"



def test_a_diverged_seed_gives_the_worse_state_and_bn_diverged_gives_no_share(spec, tmp_path):
    """rules `diverged` (version 4): bn diverged where 8 x 16 did not breaks whatever its
    other seeds lost; a fix's gain over it then has 2 pairs, fewer than min_seeds: unclear, and
    no share is measured; a fix or gnws that diverged is no better, or drops."""
    cells = swap(made_up(), cell("bn", 2, [79.7, 80.7, 79.2], diverged=(2,)))
    g, state = practice.bn_states(cells)[2]
    assert state == "breaks" and g["n"] == 2 and g["gap"] < 1
    gn = practice.fix_at_two(cells, practice.find(cells, "gn", 2))
    assert gn["gain"]["n"] == 2 and gn["state"] == "unclear" and gn["share"][1] is None
    d = practice.Practice(RunsData(spec, cells, "cifar10-5085", tmp_path, tmp_path))
    assert practice.finding(d)[0].text.startswith(
        "BN breaks at 8 x 2 on resnet20 (it diverged on 1 of 3 seeds where 8 x 16 did not); ")
    assert "regains" not in practice.finding(d)[0].text  # no share where bn diverged
    assert "| 79.7, 80.7, seed 2 diverged |" in practice.render(d)  # each seed's end
    sync = swap(made_up(), cell("syncbn4", 2, [80.0, 81.0, 79.5], diverged=(0,)))
    assert practice.fix_at_two(sync, practice.find(sync, "syncbn4", 2))["state"] == "no better"
    gnws = swap(made_up(), cell("gnws", 8, [79.0, 79.6, 78.9], diverged=(1,)))
    verdict, each = practice.flatness(gnws, "gnws")
    assert verdict == "drops" and each[8][1] == "drops"


def test_the_best_fix_is_the_best_state_first_and_version_3s_reading_is_on_the_page(
        spec, tmp_path):
    """rules `advice` (version 4): a noisy fix with the largest mean gain, ruled no better,
    is not the best where another recovers; the page says what version 3 (the largest gain
    alone) gives."""
    cells = swap(made_up(), cell("syncbn4", 2, [88.0, 72.0, 80.0]))
    d = practice.Practice(RunsData(spec, cells, "cifar10-5085", tmp_path, tmp_path))
    row, old = practice.advice_row(d), practice.advice_row(d, v3=True)
    assert old["best"]["fix"] == "syncbn4" and old["best"]["state"] == "no better"
    assert row["best"]["state"] == "partly" and row["best"]["fix"] == "gn"
    assert "no fix beats BN" not in practice.finding(d)[0].text
    assert practice.before_v4(d) == "best fix SyncBN in groups of 4 ranks (no better)"
    md = practice.render(d)
    assert ("Version 4 (commit" in md and "Without it the rules give: best fix SyncBN in groups "
            "of 4 ranks (no better)" in md)
    same = practice.Practice(RunsData(spec, made_up(), "cifar10-5085", tmp_path, tmp_path))
    assert practice.before_v4(same) == "the same states, shares and best fixes"
    free = swap(made_up(), cell("gnws", 2, [90.0, 65.0, 82.0]))  # the largest gain, no better
    df = practice.Practice(RunsData(spec, free, "cifar10-5085", tmp_path, tmp_path))
    assert practice.advice_row(df)["best_free"]["fix"] == "gn"  # partly
    assert practice.advice_row(df, v3=True)["best_free"]["fix"] == "gnws"
    assert practice.before_v4(df) == ("best without per-step communication GroupNorm + WS "
                                      "(no better)")
    gone = swap(made_up(), cell("bn", 2, [70.0, 71.3, 69.2], diverged=(2,)))
    dg = practice.Practice(RunsData(spec, gone, "cifar10-5085", tmp_path, tmp_path))
    assert "a share of" in practice.before_v4(dg) and "where version 4 measures none" \
        in practice.before_v4(dg)  # version 3 read a share where bn diverged


def test_the_page_says_what_the_pilot_left_unsettled(monkeypatch):
    """A length no doubling settled and a rate still on its ladder's edge, as the pilot's
    choices give them; nothing where each is plainly chosen."""
    from bnlab.claims import practicepilot

    gn, gnws = cell("gn", 2, [50.0] * 3), cell("gnws", 2, [60.0] * 3)
    gnws.cell.cfg["batch_per_gpu"] = 2
    picks = {"length": {"state": "not settled", "length": 120, "why": "the longest tried"},
             "gn": {"state": "chosen", "cell": gn, "beyond": None},
             "gnws": {"state": "chosen", "cell": gnws, "beyond": 0.4},
             "evonorm": {"state": "chosen", "cell": gn, "beyond": None}}
    monkeypatch.setattr(practice.table, "runs_data", lambda ctx: None)
    monkeypatch.setattr(practicepilot, "choices", lambda d: picks)
    ctx = practice.table.Context(practice.TABLE)
    assert practice.pilot_caveats(ctx) == (
        "the length is not settled: every doubling it tried added 1 point or "
        "more, so 120 epochs, the longest tried, is used and the reference may not have reached "
        "its plateau", "GroupNorm + WS's rate, 0.1 at global batch 128 (chosen at 8 x 2 over 30 "
        "epochs), is the highest its pilot tried, even with the rate its rule added, so 0.4 "
        "might do better")
    picks["gnws"]["beyond"] = 0.025  # the ladder's low end
    assert "0.1 at global batch 128 (chosen at 8 x 2 over 30 epochs), is the lowest its pilot " \
        "tried, even with the rate its rule added, so 0.025 might do better" in \
        practice.pilot_caveats(ctx)[1]
    picks["length"]["state"], picks["gnws"]["beyond"] = "chosen", None
    assert practice.pilot_caveats(ctx) == ()


def test_the_page_and_figure_build_from_runs_and_before_any(spec, tmp_path):
    d = practice.Practice(RunsData(spec, made_up(), "cifar10-5085", tmp_path, tmp_path),
                          pilot=("the length is not settled",))
    md = practice.render(d)
    assert ("| BN: gap to its 8 x 16 | reference | +0.4 (-0.3 to 1.1), holds | +3.0 (2.3 to "
            "3.7), breaks | +10.0 (9.3 to 10.7), breaks |") in md
    assert "gap to its own 8 x 16 (across batches: flat)" in md
    assert ("\n\nFrom 8 x 16 to 8 x 2 (global batch 128 to 16, 30 epochs), BN holds at 8, "
            "breaks at 4 and 2 images per rank; GroupNorm is flat and GroupNorm+WS drops (flat: "
            "at every per-rank batch less than 2 points under its own 8 x 16, the interval's "
            "upper end under 4; a gain counts as flat).") in md  # the line across
    assert ("| bn's loss at 2 images per rank against 16 | +10.0 (9.3 to 10.7) | 11.0 |\n"
            "| bn's loss at 2 images per rank against 32 (not run here) | - | 11.1 |") in md
    assert "| gn's gap to bn at 16 images per rank | +2.0 (1.8 to 2.2) | 0.5 |" in md
    assert ("the largest gain: here SyncBN in groups of 4 ranks (recovers); without per-step "
            "communication, GroupNorm (partly).") in md  # the doctor's best two, by name
    assert "Where the evidence is weak" not in md  # bn's loss and every recovery are clear
    assert "| gn's gap to the bn reference | gn at 30 epochs | gn at 60 epochs |" in md
    assert "CIFAR-10 subset (5,085 training images) at the end" in md  # the tag's count
    assert ("From its pilot ([table-practicepilot](../practicepilot/table.md), on held-out "
            "training images):\n\n- the length is not settled.\n") in md
    for t in ("recover", "converge", "batch"):  # the earlier protocol, one click from finding 2
        assert f"[table-{t}](../{t}/table.md)" in md
    assert "| 8 x 16 | +2.0 (1.8 to 2.2) | +1.0 (1.0 to 1.0) |" in md  # gn at twice the length
    assert "| 8 x 2 | +2.0 (1.8 to 2.2) | to come |" in md
    assert "| bn 8x16 | 0.1 | 30 | 3 | 1,200 | 0.500 | 80.0, 81.0, 79.5 |" in md  # each seed
    practice.plot(d, tmp_path / "practice.png")
    assert (tmp_path / "practice.png").stat().st_size > 10_000
    waiting = practice.Practice(None, "its spec is to come")
    assert "No runs yet: its spec is to come." in practice.render(waiting)


def test_the_page_says_where_the_evidence_at_8x2_is_weak(spec, tmp_path):
    """bn's loss at 8 x 2 with its interval under the break rule's 2 points, and a fix that
    recovers by its gap while its gain over bn there reaches below 0: both said, in numbers."""
    cells = swap(made_up((0.4, 3.0, 2.5)), cell("syncbn4", 2, [79.0, 78.8, 78.5]))
    md = practice.render(practice.Practice(RunsData(spec, cells, "cifar10-5085", tmp_path,
                                                    tmp_path)))
    assert "| SyncBN in groups of 4 ranks | 78.8 (78.1 to 79.4) | +1.4 (-0.3 to 3.1) | " \
        "+1.1 (-1.3 to 3.5) | 44% (0 to 64) | recovers |" in md
    assert ("Where the evidence is weak: bn's own loss at 8 x 2, +2.5 (1.8 to 3.2), which every "
            "share divides by, has an interval reaching below the rule's 2 points; SyncBN in "
            "groups of 4 ranks recovers by its gap to the reference, but its gain over bn at "
            "8 x 2, +1.1 (-1.3 to 3.5), reaches 0 or below: the 3 seeds cannot tell that gain "
            "from none.") in md
    missing = practice.render(practice.Practice(RunsData(
        spec, [c for c in cells if c.cell.meta["fix"] != "frozen_bn"] +
        [cell("frozen_bn", 2, [69.5, 71.4])], "cifar10-5085", tmp_path, tmp_path)))
    assert "then the largest gain.\n" in missing  # no best named while a fix has seeds to come


def test_the_doctors_thresholds_are_judged_on_bns_cells_below_the_reference():
    j = practice.doctor_judgment(made_up())  # bn holds at 8, breaks at 4 and 2
    assert [(r["per_rank"], r["values"], r["state"], r["flagged"]) for r in j["rows"]] == [
        (8, 512, "holds", False), (4, 256, "breaks", True), (2, 128, "breaks", True)]
    assert j["answer"] == "supported" and j["change"] is None
    early = practice.doctor_judgment(made_up((3.0, 3.0, 10.0)))  # breaks at 8: passed there
    assert early["answer"] == ("not supported (bn breaks at 8 x 8 (8 images, 512 values), "
                               "which the doctor passes)")
    assert early["change"] is None  # no per-rank batch holds: nothing to move the threshold to
    late = practice.doctor_judgment(made_up((0.4, 0.4, 10.0)))  # holds at 4: flagged there
    assert late["answer"].startswith("not supported (bn holds at 8 x 4") and late["change"] == 4
    waiting = [c for c in made_up() if c.cell.label != "bn 8x4"] + [cell("bn", 4, [77.0, 78.3])]
    j = practice.doctor_judgment(waiting)  # a seed still to come
    assert (j["answer"], j["ended"]) == ("undecided", False)
    j = practice.doctor_judgment(swap(made_up(), WIDE))  # every seed ended, bn unclear at 8
    assert (j["answer"], j["ended"]) == ("undecided (bn unclear at 8 x 8)", True)


@pytest.mark.parametrize("lost_at, then", [
    ((0.4, 3.0, 10.0), "The thresholds: **supported**. The thresholds stay."),
    ((3.0, 3.0, 10.0), "bn holds at no per-rank batch below 16, so doctor_change has no batch"),
    ((3.0, 0.4, 10.0), "bn's breaking and holding per-rank batches do not separate, so by "
                       "doctor_change the thresholds stay"),
    ((0.4, 0.4, 10.0), "By doctor_change, MIN_IMAGES becomes 4 (the smallest per-rank batch"),
])
def test_the_page_says_what_doctor_change_gives_in_each_case(lost_at, then, monkeypatch):
    monkeypatch.setattr(practice.doctor, "MIN_IMAGES", practice.JUDGED[0])  # not yet moved
    monkeypatch.setattr(practice.doctor, "MIN_VALUES", practice.JUDGED[1])
    md = "\n".join(practice.doctor_lines(made_up(lost_at)))
    assert then in md and "bnlab's thresholds are now" not in md
    assert "| bn cell | images per rank | values per channel per rank | bn's state |" in md
    assert "bnlab's doctor flags a BN layer below 8 images or 16 values" in md


def test_the_page_says_why_the_thresholds_are_undecided(monkeypatch):
    monkeypatch.setattr(practice.doctor, "MIN_IMAGES", practice.JUDGED[0])
    monkeypatch.setattr(practice.doctor, "MIN_VALUES", practice.JUDGED[1])
    waiting = "\n".join(practice.doctor_lines(made_up()[:3]))
    assert "The thresholds: **undecided**. The thresholds stay until every bn cell has its " \
           "seeds." in waiting
    unclear = "\n".join(practice.doctor_lines(swap(made_up(), WIDE)))
    assert "**undecided (bn unclear at 8 x 8)**. The rule leaves them undecided" in unclear


def test_once_doctor_change_has_moved_min_images_the_judgment_reads_as_it_did(monkeypatch):
    """The rule judges the thresholds it was written against (8 images, 16 values): after the
    commit that moves MIN_IMAGES to 4, the page still says what it found of 8 and that the
    change was made, and adds the answer at bnlab's thresholds now."""
    late = made_up((0.4, 0.4, 10.0))  # holds at 8 and 4, breaks at 2
    monkeypatch.setattr(practice.doctor, "MIN_IMAGES", practice.JUDGED[0])
    before = "\n".join(practice.doctor_lines(late))
    monkeypatch.setattr(practice.doctor, "MIN_IMAGES", 4)
    j = practice.doctor_judgment(late)
    assert j["answer"].startswith("not supported (bn holds at 8 x 4") and j["change"] == 4
    md = "\n".join(practice.doctor_lines(late))
    assert md != before and "By doctor_change, MIN_IMAGES became 4" in md
    assert "bnlab's doctor flagged a BN layer below 8 images or 16 values per channel per rank " \
           "(rules: doctor) when its rule was written, the thresholds judged here." in md
    assert md.rstrip().endswith("bnlab's thresholds are now 4 images and 16 values "
                                "(bnlab/defaults.py); at those: **supported**.")


def test_the_advice_row_has_every_fix_at_8x2_in_table_recovers_form(spec, tmp_path):
    d = practice.Practice(RunsData(spec, made_up(), "cifar10-5085", tmp_path, tmp_path))
    row = practice.advice_row(d)
    assert row["table"] == "table-practice" and row["values"] == 128
    assert row["where"] == "8 ranks x 2 on resnet20 (CIFAR-10)" and row["global_batch"] == 16
    assert set(row["fixes"]) == {"gn", "gnws", "syncbn4", "frozen_bn"}
    assert row["best"]["fix"] == "syncbn4" and row["best_free"]["fix"] == "gn"
    assert row["fixes"]["gn"]["groups"] == 8 and row["fixes"]["syncbn4"]["state"] == "recovers"
    practice.advice(d, tmp_path)  # built outside experiments/practice: beside the table
    got = json.loads((tmp_path / "practice.json").read_text())
    assert got["fixes"] == json.loads(json.dumps(row["fixes"]))
    assert got["thresholds"]["answer"] == "supported"
    assert got["thresholds"]["global_batches"] == "16 to 128"
    assert got["thresholds"]["judged"] == {"images": 8, "values": 16}
    assert got["thresholds"]["change"] is None
    unclear = practice.Practice(RunsData(spec, swap(made_up(), WIDE), "cifar10-5085", tmp_path,
                                         tmp_path))
    practice.advice(unclear, tmp_path)  # every bn cell ended: the doctor reads the undecided
    got = json.loads((tmp_path / "practice.json").read_text())
    assert got["thresholds"]["answer"] == "undecided (bn unclear at 8 x 8)"
    waiting = practice.Practice(RunsData(spec, made_up()[:3], "cifar10-5085", tmp_path,
                                         tmp_path))
    assert practice.advice_row(waiting) is None
    practice.advice(waiting, tmp_path)
    assert not (tmp_path / "practice.json").exists()


def test_its_finding_tells_finding_2_once_the_8x2_cells_have_their_seeds(spec, tmp_path):
    d = practice.Practice(RunsData(spec, made_up(), "cifar10-5085", tmp_path, tmp_path))
    top, = practice.finding(d)  # table-recover sets the line under it (test_recover.py)
    assert top.text.startswith("BN breaks at 8 x 2 on resnet20, 10.0 points (9.3 to 10.7) "
                               "under 8 x 16; ")
    assert "; SyncBN in 4-rank groups regains 89% of BN's loss (95% CI" \
        in top.text and "communication-free GroupNorm " in top.text  # its best two, states
    assert top.rank == 2 and set(top.replaces) == {"recover", "converge"}
    assert top.after == ""  # finding 4 says its own protocol: no sentence below the list
    shown = re.sub(r"\]\([^)]*\)", "]", top.line())  # as the README shows it
    assert len(top.text.split()) <= 40  # one sentence, as tests/test_layout.py counts it
    assert len(f"2. {shown}".split()) <= 45  # the words issue: 45 for each line
    assert practice.title(d) == ("BN breaks at 4 and 2 images per rank; GroupNorm is flat, "
                                 "GroupNorm+WS drops (ours, beside Wu and He's)")  # its finding
    holds = practice.Practice(RunsData(spec, made_up((0.4, 0.4, 0.4)), "cifar10-5085", tmp_path,
                                       tmp_path))  # BN holds at 8 x 2: no fix to name
    assert practice.finding(holds)[0].text == (
        "BN holds at 8 x 2 on resnet20, 0.4 points (-0.3 to 1.1) under 8 x 16, within the "
        "rule's 2 points, so no fix's share of its loss is measured.")
    eight = [c for c in made_up() if c.cell.label != "bn 8x8"]  # 8 x 8 cut: no title across
    d8 = practice.Practice(RunsData(spec, eight, "cifar10-5085", tmp_path, tmp_path))
    assert practice.finding(d8)[0].text == top.text and "runs to come" in practice.title(d8)
    waiting = practice.Practice(RunsData(spec, made_up()[:3], "cifar10-5085", tmp_path,
                                         tmp_path))
    assert practice.finding(waiting) == [] and practice.finding(practice.Practice(None)) == []


def longest() -> list[CellResult]:
    """made_up's cells with the longest finding 2 they can give: BN unclear at 8 x 2 would
    carry no share, so BN breaks; the best fix, SyncBN in 4-rank groups, past 100% of BN's
    loss with a wide interval, and the best without communication GroupNorm+WS, unclear."""
    cells = [c for c in made_up() if c.cell.label not in ("syncbn4 8x2", "gnws 8x2")]
    return [*cells, cell("syncbn4", 2, [86.0, 78.4, 80.1]), cell("gnws", 2, [80.0, 74.0, 82.5])]


@pytest.mark.parametrize("cells", [made_up, longest])
def test_the_readme_s_findings_fit_1800_characters_once_this_table_tells_finding_2(
        spec, tmp_path, cells):
    """The words issue's budget, read where it applies (finding 2 told from this table): the
    committed findings (experiments/headline.json) with this table's, from made-up cells, in
    their place, written as `make report` writes them; at most 1,800 characters of prose."""
    h = json.loads(readme.HEADLINE.read_text())
    kept = [Finding(f["text"], f["table"], f["mark"], f["rank"], f["after"],
                    under=tuple(Finding(u["text"], u["table"], u["mark"]) for u in f["under"]))
            for f in h["findings"] if f["table"] not in ("practice", *practice.REPLACES)]
    d = practice.Practice(RunsData(spec, cells(), "cifar10-5085", tmp_path, tmp_path))
    found = readme.headline_findings([*kept, *practice.finding(d)])  # as make report picks
    assert [f.table for f in found][:2] == ["values", "practice"]  # finding 2, in its place
    assert not {"recover", "converge"} & {f.table for f in found}  # theirs one click away
    assert "Plain GroupNorm" not in " ".join(f.after for f in found)  # and their sentence below
    verdicts = [Verdict(v["claim"], "", v["claimed"], v["ours"], v["verdict"], "",
                        final=v["final"]) for v in h["verdicts"]]
    out = tmp_path / "README.md"
    out.write_text("## What it found\n\n<!-- headline:begin -->\n<!-- headline:end -->\n")
    readme.write_headline(out, [], verdicts, "", tuple(found))
    shown = readme.prose(out.read_text())
    assert shown[0].startswith("Terms: ") and "Share of BN's loss against 8 x 16: " in shown[0]
    assert "Pilot:" not in shown[0] and "Values:" not in shown[0]  # no finding uses them now
    assert sum(map(len, shown)) <= 1800, "\n".join(f"{len(s)} {s}" for s in shown)
    print(shown[2], sum(map(len, shown)), "characters")


def test_the_doctor_s_images_threshold_is_the_one_doctor_change_gave():
    """The committed judgment (bnlab/measured/practice.json, from the committed runs) and
    bnlab's default agree: rule doctor judged 8 images and 16 values, doctor_change gave the
    smallest per-rank batch at which bn held, and that is MIN_IMAGES."""
    from bnlab import advice
    from bnlab.defaults import MIN_IMAGES, MIN_VALUES

    j = json.loads(advice.PRACTICE.read_text())["thresholds"]
    assert j["judged"] == {"images": 8, "values": 16} and j["answer"].startswith("not supported")
    assert (j["change"], MIN_VALUES) == (MIN_IMAGES, 16)
