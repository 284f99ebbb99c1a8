"""table-converge: table-recover's cells made 4x longer (cosine), judged by table-recover's
states at 3 seeds, each fix's state beside its 10-epoch state; its spec from the pilot's
choices."""

from __future__ import annotations

import json
import re

import pytest
from test_recover import data

from bnlab.claims import converge, recover
from bnlab.errors import BnlabError
from bnlab.lab import page
from bnlab.lab.plan import Cell
from bnlab.lab.results import CellResult
from bnlab.paths import EXPERIMENTS, MEASURED

TEN = {"reference": 60.0, "bn": 50.0, "syncbn": 59.8, "gn": [50.5, 49.5, 50.5, 49.5, 50.0],
       "gnws": 55.0, "evonorm": 45.0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The runs the tests below judge, built once: 10 epochs (ten), 40 epochs where gn is now
    clearly between bn and the reference (forty), 40 epochs as at 10 (same), 40 epochs with a
    gnws seed to come (short)."""
    tmp = tmp_path_factory.mktemp("converge")
    return {"ten": data(tmp / "ten", TEN),
            "forty": data(tmp / "forty", {**TEN, "gn": 55.0}, seeds=3, epochs=40),
            "same": data(tmp / "same", TEN, seeds=3, epochs=40),
            "short": data(tmp / "short", TEN, seeds=3, missing="gnws", epochs=40)}


def test_the_spec_makes_table_recovers_resnet20_cells_longer():
    def chosen(fix: str, over: list[str]) -> dict:
        cell = Cell(f"{fix} lr 0.00625", [*over, "optim.lr=0.00625", "model=resnet20",
                                          "data.holdout=1000", "eval_every=4",
                                          "record.predictions=false"], [0, 1], cfg={},
                    meta={"fix": fix, "lr": 0.00625})
        return {"state": "chosen", "cell": CellResult(cell, [], 2)}

    picks = {"syncbn": chosen("syncbn", ["norm=syncbn"]),
             "gn": chosen("gn", ["norm=gn", "norm.groups=8"]),
             "gnws": chosen("gnws", ["norm=gnws", "norm.groups=8"]),
             "evonorm": chosen("evonorm", ["norm=evonorm", "norm.groups=8"]),
             "ln": chosen("ln", ["norm=ln"])}  # not one of its cells
    cells = converge.spec_cells(picks)
    assert [c["fix"] for c in cells] == ["reference", "bn", "syncbn", "gn", "gnws", "evonorm"]
    for c in cells:
        assert c["overrides"][-3:] == ["epochs=40", "optim.schedule=cosine", "eval_every=2"]
        assert "epochs=10" not in c["overrides"] and "model=resnet20" in c["overrides"]
        assert not any(o.startswith("data.holdout") for o in c["overrides"])
    assert cells[4]["overrides"][:2] == ["norm=gnws", "norm.groups=8"]
    with pytest.raises(BnlabError, match="no cells for gnws"):
        converge.spec_cells({k: v for k, v in picks.items() if k != "gnws"})
    with pytest.raises(BnlabError, match="has not chosen every fix yet: gn"):
        converge.spec_cells({**picks, "gn": {"state": "undecided", "cell": None}})


def test_each_fix_is_set_beside_its_ten_epoch_state_and_the_ranking_answers(runs, tmp_path):
    ten = runs["ten"]
    d = converge.Converge(runs["forty"], ten)
    answer, words = converge.ranking(d)
    assert answer == "changes (gn)"
    assert "gn: no better at 10 epochs, partly, 50% of bn's loss at 40" in words
    assert words[0].startswith("syncbn: recovers") and words[0].count("recovers") == 2
    text = converge.render(d)
    assert "**The ranking at 40 epochs: changes (gn)**" in text
    assert "| gn cell |" in text and "## Rules and their history" in text
    assert converge.ranking(converge.Converge(runs["same"], ten))[0] == "holds"
    assert converge.ranking(converge.Converge(runs["short"], ten))[0] == "undecided"
    converge.plot(d, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_without_its_spec_the_page_says_what_it_waits_for():
    text = converge.render(converge.Converge(None, None, "its spec is written later"))
    assert "Not run yet: its spec is written later." in text
    assert "The ranking: the ranking holds where every fix" in text
    assert recover.COMMUNICATION_FREE.count("gnws") == 1 and "gnws" in recover.NAMES


def test_its_finding_sits_under_table_recovers_and_names_what_changed(runs, tmp_path):
    ten, forty = runs["ten"], runs["forty"]
    (f,) = converge.finding(converge.Converge(forty, ten))
    assert f.extends == "recover" and f.table == "converge"
    assert f.text.startswith("At 40 epochs (4x longer) on resnet20, SyncBN gets "
                             "back 98% of BN's loss (95% CI")  # every share its state
    assert re.search(r"GroupNorm 50% \(\S+ to \S+\), partly", f.text)
    assert f.text.endswith("; EvoNorm-S0 no better than BN. At 10 epochs, GroupNorm did no "
                           "better.")
    same = converge.Converge(runs["same"], ten)
    assert converge.finding(same)[0].text.endswith(". Each fix's state is as at 10 epochs.")
    unsure = data(tmp_path / "unsure", {**TEN, "syncbn": [63.0, 55.0, 64.0, 54.0, 61.0]})
    text = converge.finding(converge.Converge(forty, unsure))[0].text
    assert text.endswith(". Ranking undecided, as SyncBN at 10 epochs was unclear; at 10 "
                         "epochs GroupNorm did no better.")
    assert converge.finding(converge.Converge(forty, None))[0].text.endswith(
        "no better than BN. Its 10-epoch states are still to come.")  # table-recover's to come
    short = converge.Converge(runs["short"], ten)
    assert converge.finding(short)[0].text == \
        "At 40 epochs (4x longer) on resnet20: runs still to come."
    assert converge.measured(short) is None


def test_where_no_fix_beats_bn_or_bn_no_longer_breaks_the_finding_says_so(runs, tmp_path):
    none = data(tmp_path / "none", {**TEN, "syncbn": 45.0, "gn": 45.0, "gnws": 45.0,
                                    "evonorm": 45.0}, seeds=3, epochs=40)
    text = converge.finding(converge.Converge(none, runs["ten"]))[0].text
    assert text.startswith("At 40 epochs (4x longer) on resnet20, no fix beats BN. "
                           "At 10 epochs, SyncBN recovered and GroupNorm+WS partly recovered.")
    whole = data(tmp_path / "whole", {**TEN, "bn": 59.9}, seeds=3, epochs=40)
    text = converge.finding(converge.Converge(whole, runs["ten"]))[0].text
    assert text.startswith("At 40 epochs (4x longer) on resnet20, BN at 4 x 2 no "
                           "longer breaks, so no share of its loss is read: SyncBN recovers, ")
    assert page.listed(["a"]) == "a" and page.listed(["a", "b", "c"]) == "a, b and c"


def test_converge_json_holds_each_fix_as_advice_json_does(runs, tmp_path):
    d = converge.Converge(runs["forty"], runs["ten"])
    assert converge.measured_path(tmp_path) == tmp_path / "converge.json"  # built elsewhere
    assert converge.measured_path(EXPERIMENTS / "converge") == MEASURED / "converge.json"
    converge.write_measured(d, tmp_path)
    got = json.loads((tmp_path / "converge.json").read_text())
    assert got["input"] == "resnet20" and got["epochs"] == 40 and got["bn_breaks"]
    assert set(got["fixes"]) == set(converge.FIXES)
    assert got["fixes"]["gn"]["state"] == "partly" and got["fixes"]["gn"]["name"] == "GroupNorm"
    assert got["fixes"]["gn"]["share"] == pytest.approx(0.5, abs=0.05)
    converge.write_measured(converge.Converge(None, runs["ten"]), tmp_path)  # runs to come
    assert not (tmp_path / "converge.json").exists()


def test_a_fix_whose_runs_equal_the_references_is_said_to_be_an_identity(runs):
    import copy

    forty = copy.copy(runs["forty"])
    ref, sync = (converge.recover.by_fix(forty, f) for f in ("reference", "syncbn"))
    forty.cells = [copy.copy(c) for c in forty.cells]
    twin = next(c for c in forty.cells if c.cell.meta["fix"] == "syncbn")
    twin.runs = ref.runs  # the same logs, seed by seed
    assert converge.identical(forty, "syncbn") and not converge.identical(runs["forty"], "gn")
    assert sync.runs is not ref.runs and converge.identical(runs["ten"], "syncbn") is False
    (text, _) = converge.same_runs(converge.Converge(forty, runs["ten"]))
    assert text.startswith("syncbn's runs log the same val acc as the 1 x 8 reference's")
    assert "Its 10-epoch runs (commits" in text and "seeds' noise stays" in text
    got = converge.measured(converge.Converge(forty, runs["ten"]))
    assert got["fixes"]["syncbn"]["identical"] and "identical" not in got["fixes"]["gn"]
    assert converge.share_words(got["fixes"]["syncbn"], True) == \
        "SyncBN gets back all of BN's loss, recovers (its runs equal 1 x 8's)"  # its state
    assert converge.same_runs(converge.Converge(runs["forty"], runs["ten"])) == []
