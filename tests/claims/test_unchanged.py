"""A rewrite of the claims' words moves no number and no verdict: every table's page and
every claim's verdict, as `make report` writes them now, against tests/claims/numbers.json
(recorded before the findings-first rewrite; tests/claims/snapshot.py says what it holds)."""

from __future__ import annotations

import json
from pathlib import Path

from snapshot import page, snapshot, states, verdicts

RECORD = Path(__file__).with_name("numbers.json")


def test_every_number_and_verdict_is_as_recorded():
    before, now = json.loads(RECORD.read_text()), snapshot()
    assert now["verdicts"] == before["verdicts"]
    for name, old in before["pages"].items():
        assert name in now["pages"], f"experiments/{name}/table.md is gone"
        assert now["pages"][name]["rows"] == old["rows"], name
        assert now["pages"][name]["states"] == old["states"], name


def test_the_snapshot_sees_a_moved_number_and_a_changed_state():
    text = ("| cell | gap |\n|---|---|\n| a | +1.2 (0.3 to 2.1) |\n| b | -4.0 |\n\n"
            "**What governs: neither alone**; **C1: not reproduced**\n")
    base = page(text)
    assert base["rows"] == [["1.2", "0.3", "2.1"], ["4.0"]]
    assert base["states"] == ["neither alone", "not reproduced"]
    assert page(text.replace("+1.2", "+1.3"))["rows"] != base["rows"]
    assert page(text.replace("+1.2", "-1.2"))["rows"] == base["rows"]  # one sign convention
    assert page(text.replace("not reproduced", "partly"))["states"] != base["states"]
    assert states("holds, then breaks; not supported") == ["breaks", "holds", "not supported"]
    assert verdicts("| C6 | `make x` | y | z | **partly (preliminary)** | w |") == {"C6": "partly"}
