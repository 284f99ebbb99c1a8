"""The specs written from table-recoverpilot's choices: table-recover's grows where the pilot
chooses a fix again at a new setting (its rules version 2), and refuses any other change."""

from __future__ import annotations

import pytest
import yaml

from bnlab.claims import frompilot, recover
from bnlab.errors import BnlabError
from bnlab.lab.plan import Cell
from bnlab.lab.results import CellResult

PILOT = {"gn lr 0.00625": {"groups": 32}, "gn 8 groups lr 0.00625": {"groups": 8},
         "gnws 8 groups lr 0.00625": {"groups": 8}, "syncbn lr 0.00625": {},
         "syncbn lr 0.025": {}}
PREFER = {"gn": ("groups", [8, 32]), "gnws": ("groups", [8, 32])}


def chosen(label: str, fix: str, over: list[str], lr: float = 0.00625) -> dict:
    cell = Cell(label, [*over, f"optim.lr={lr:g}", "model=resnet20", "data.holdout=1000",
                        "eval_every=4", "record.predictions=false"], [0, 1], cfg={},
                meta={"fix": fix, "lr": lr})
    return {"state": "chosen", "cell": CellResult(cell, [], 2)}


V1 = {"syncbn": chosen("syncbn lr 0.00625", "syncbn", ["norm=syncbn"]),
      "gn": chosen("gn lr 0.00625", "gn", ["norm=gn", "norm.cap_groups=true"])}
V2 = {**V1, "gn": chosen("gn 8 groups lr 0.00625", "gn", ["norm=gn", "norm.groups=8"]),
      "gnws": chosen("gnws 8 groups lr 0.00625", "gnws", ["norm=gnws", "norm.groups=8"])}


def test_the_spec_takes_each_chosen_cell_less_the_pilot_s_held_out_split():
    cells = frompilot.spec_cells({"gn": V1["gn"]})
    assert [(c["input"], c["fix"], c["order"]) for c in cells] == [
        ("resnet20", "reference", 0), ("resnet20", "bn", 0), ("resnet20", "gn", 0),
        ("resnet18 32 px", "reference", 1), ("resnet18 32 px", "bn", 1),
        ("resnet18 32 px", "gn", 1)]  # resnet20's runs first
    assert cells[2]["overrides"] == ["norm=gn", "norm.cap_groups=true", "optim.lr=0.00625",
                                     "model=resnet20"]
    assert cells[5]["overrides"] == ["norm=gn", "norm.cap_groups=true", "optim.lr=0.00625",
                                     "model=resnet18"]  # resnet20's choice on the other input
    assert cells[5]["label"] == "resnet18 32 px: gn lr 0.00625"  # as the pilot labels it
    with pytest.raises(BnlabError, match="has not chosen every fix yet: brn \\(undecided\\)"):
        frompilot.spec_cells({**V1, "brn": {"state": "undecided", "cell": None}})


def test_a_new_setting_keeps_the_old_cells_as_measured_and_adds_new_ones_after_them():
    old = frompilot.spec_cells(V1)
    cells, said = frompilot.grown(old, frompilot.spec_cells(V2), PILOT, PREFER)
    assert cells[:len(old)] != old and len(cells) == len(old) + 4  # gn at 8 and gnws, 2 inputs
    assert [c["overrides"] for c in cells[:len(old)]] == [c["overrides"] for c in old]
    gn32 = [c for c in cells if c["fix"] == "gn32"]
    assert [c["label"] for c in gn32] == ["resnet20: gn 32 groups lr 0.00625 (superseded)",
                                          "resnet18 32 px: gn 32 groups lr 0.00625 (superseded)"]
    assert gn32[0]["name"] == "GroupNorm, 32 groups" and gn32[0]["of"] == "gn"
    assert gn32[0]["superseded"] == "the pilot chose 8 groups (its rules version 2)"
    new = cells[len(old):]
    assert [(c["input"], c["fix"], c["order"]) for c in new] == [
        ("resnet20", "gn", 2), ("resnet20", "gnws", 2), ("resnet18 32 px", "gn", 3),
        ("resnet18 32 px", "gnws", 3)]  # after every old cell, the first input first
    assert new[2]["overrides"] == ["norm=gn", "norm.groups=8", "optim.lr=0.00625",
                                   "model=resnet18"]
    assert "new: resnet20: gnws 8 groups lr 0.00625" in said and len(said) == 6
    again, said = frompilot.grown(cells, frompilot.spec_cells(V2), PILOT, PREFER)
    assert again == cells and said == []  # grown once: the same choices change nothing more


def test_a_changed_rate_is_a_rule_change_and_is_refused():
    old = frompilot.spec_cells(V1)
    moved = {**V1, "syncbn": chosen("syncbn lr 0.025", "syncbn", ["norm=syncbn"], 0.025)}
    with pytest.raises(BnlabError, match="syncbn on resnet20 changed otherwise than in its "
                       "setting"):
        frompilot.grown(old, frompilot.spec_cells(moved), PILOT, PREFER)


def test_write_spec_grows_the_committed_spec_and_refuses_to_rewrite_otherwise(tmp_path,
                                                                             monkeypatch):
    path = tmp_path / "sweep.yaml"
    monkeypatch.setattr(frompilot, "pilot_picks", lambda data=None: V1)
    assert frompilot.write_spec(path) == 0
    first = path.read_text()
    assert frompilot.write_spec(path) == 0 and path.read_text() == first  # unchanged
    monkeypatch.setattr(frompilot, "pilot_picks", lambda data=None: V2)
    monkeypatch.setattr(frompilot, "settings", lambda: (PILOT, PREFER))
    frompilot.write_spec(path)
    text = path.read_text()
    assert "# Grown by the pilot's rules version 2" in text
    fixes = [c["fix"] for c in yaml.safe_load(text)["cells"]]
    assert fixes.count("gn32") == 2 and fixes.count("gn") == 2 and fixes.count("gnws") == 2
    with pytest.raises(BnlabError, match="changed otherwise than in its setting"):
        monkeypatch.setattr(frompilot, "pilot_picks", lambda data=None: {
            **V2, "syncbn": chosen("syncbn lr 0.025", "syncbn", ["norm=syncbn"], 0.025)})
        frompilot.write_spec(path)
    assert path.read_text() == text  # nothing overwritten


def test_a_superseded_cell_is_shown_but_never_advised():
    cell = Cell("resnet20: gn 32 groups lr 0.00625 (superseded)", [], [0], cfg={},
                meta={"fix": "gn32", "name": "GroupNorm, 32 groups", "superseded": "x"})
    assert recover.name(CellResult(cell, [], 1)) == "GroupNorm, 32 groups"


def test_the_committed_pilot_names_each_cell_s_group_count():
    pilot, prefer = frompilot.settings()
    assert pilot["gn lr 0.00625"]["groups"] == 32 and prefer["gn"][0] == "groups"
    assert pilot["gn 8 groups lr 0.00625"]["groups"] == 8
    assert {pilot[f"gnws {g} groups lr 0.00625"]["groups"] for g in (8, 32)} == {8, 32}
