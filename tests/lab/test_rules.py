"""Verdict rules as data: experiments/<name>/rules.yaml read by bnlab.lab.rules, applied by
bnlab.lab.judge, and each table's history told the same way from its versions."""

from __future__ import annotations

import pytest
import yaml

from bnlab.errors import BnlabError
from bnlab.lab import judge, rules
from bnlab.paths import EXPERIMENTS

SETTLED = ("pilot", "lr", "fixes", "values")


def write(tmp_path, name: str, raw: dict) -> rules.Rules:
    (tmp_path / name).mkdir(parents=True, exist_ok=True)
    (tmp_path / name / "rules.yaml").write_text(yaml.safe_dump(raw))
    return rules.read(name, tmp_path)


def test_every_settled_table_states_its_rules_with_their_versions():
    for name in SETTLED:
        r = rules.read(name)
        assert r.raw["thresholds"] and r.versions, name
        for v in r.versions:
            assert {"version", "commit", "seen", "change"} <= set(v), (name, v)
            assert len(str(v["commit"])) >= 7


def test_the_claims_read_their_thresholds_from_the_rules():
    from bnlab.claims import fixes, lr, pilot, values

    assert rules.read("values")["break_points"] == values.BREAK
    assert rules.read("values")["hold_bound"] == values.HOLD_BOUND
    assert rules.read("lr")["steady"] == lr.STEADY and rules.read("lr")["survives"] == lr.SURVIVES
    assert rules.read("fixes")["steadiest"] == fixes.STEADIEST
    assert rules.read("pilot")["tie_points"] == pilot.TIE


def test_the_judge_applies_a_changed_threshold(tmp_path):
    base = {"thresholds": {"min_seeds": 3, "break_points": 2.0, "hold_bound": 4.0},
            "versions": [{"version": 1, "commit": "abcdef0", "seen": False, "change": "first"}]}
    r = write(tmp_path, "t", base)
    assert judge.gap_state(r, 2.5, 0.5, 4.5, 3) == "breaks"
    assert judge.gap_state(r, 1.0, -1.0, 3.0, 3) == "holds"
    assert judge.gap_state(r, 1.0, -1.0, 3.0, 2) == "unclear"  # too few seed pairs
    strict = write(tmp_path, "u", {**base, "thresholds": {**base["thresholds"],
                                                           "break_points": 3.0}})
    assert judge.gap_state(strict, 2.5, 0.5, 4.5, 3) == "unclear"


def test_history_says_each_version_and_what_the_rules_before_a_late_one_give(tmp_path):
    r = write(tmp_path, "t", {"thresholds": {"x": 1}, "versions": [
        {"version": 1, "commit": "abcdef0", "seen": False, "change": "first rules"},
        {"version": 2, "commit": "1234567", "seen": True, "gave": "old", "change": "more seeds"},
        {"version": 3, "commit": "7654321", "seen": True, "verdicts": False,
         "change": "a reading"},
        {"version": 4, "commit": "0000000", "seen": True, "change": "a block"}]})
    text = "\n".join(rules.history(r, {"old": "undecided"}))
    assert "Version 1 (commit abcdef0, written before any of the runs it judges)" in text
    assert "Version 2 (commit 1234567, written after some of its data were seen): more seeds. " \
        "Without it the rules give: undecided." in text
    assert "a reading. It moves no verdict." in text
    assert "a block. What the rules before it would give is not computed here." in text
    assert rules.mark(r) == " [†](experiments/t/table.md#rules-and-their-history)"
    first = write(tmp_path, "v", {"thresholds": {}, "versions": [
        {"version": 1, "commit": "abcdef0", "seen": False, "change": "first"}]})
    assert rules.mark(first) == ""


def test_missing_rules_or_thresholds_are_one_sentence(tmp_path):
    with pytest.raises(BnlabError, match="no rules at"):
        rules.read("nothing", tmp_path / "none")
    r = write(tmp_path, "t", {"thresholds": {}, "versions": [
        {"version": 1, "commit": "abcdef0", "seen": False, "change": "first"}]})
    with pytest.raises(BnlabError, match="has no threshold `steady`"):
        r["steady"]
    with pytest.raises(BnlabError, match="has no `versions:`"):
        write(tmp_path, "w", {"thresholds": {}})


def test_each_settled_page_tells_its_history_from_its_rules():
    for name in SETTLED:
        page = (EXPERIMENTS / name / "table.md").read_text()
        assert "## Rules and their history" in page, name
        for v in rules.read(name).versions:
            assert f"Version {v['version']} (commit {v['commit']}" in page, (name, v)


def test_a_verdict_s_disclosure_is_generated_from_the_versions(tmp_path):
    r = write(tmp_path, "t", {"thresholds": {"steady": 1.5, "min_seeds": 3}, "versions": [
        {"version": 1, "commit": "abcdef0", "seen": False, "change": "first rules"},
        {"version": "added", "commit": "1234567", "seen": True, "gave": "old",
         "change": "a rate added"},
        {"version": 2, "commit": "7654321", "seen": True, "verdicts": False,
         "change": "a clause"}]})
    told = rules.disclosure(r, {"old": "untestable"})
    assert told == (" Disclosed: Version added (commit 1234567, written after some of its data "
                    "were seen): a rate added. Without it the rules give: untestable. Version 2 "
                    "(commit 7654321, written after some of its data were seen): a clause. It "
                    "moves no verdict.")
    assert "Version added" not in rules.disclosure(r, {"old": None})  # not these data's
    assert rules.said(r, "steady", "min_seeds") == \
        "steady 1.5, min_seeds 3 (experiments/t/rules.yaml)"
