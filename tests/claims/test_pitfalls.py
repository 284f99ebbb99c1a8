"""C11's table and verdict from recorded observations (the live cases run in
`make table-pitfalls`; the launch pitfall's bnlab behaviour is tested in test_dist.py)."""

from __future__ import annotations

import copy
import json

from bnlab import claims
from bnlab.claims import pitfalls
from bnlab.paths import ROOT

RECORDED = json.loads((ROOT / "experiments/pitfalls/results.json").read_text())


def test_the_table_shows_every_observation_and_the_verdict():
    text = pitfalls.table(RECORDED)
    for case in ("SyncBN conversion after DDP wrapping", "every process started as rank 0",
                 "BN sees 1 value per channel"):
        assert case in text
    unused = RECORDED["convert_after_wrap"]["after, find_unused_parameters"]
    assert f"{unused['max_rank_diff_bn_affine']:.3g}" in text
    assert RECORDED["one_value"]["bnlab bn, 1 image per rank"]["message"] in text
    assert f"**C11 verdict: {pitfalls.verdict(RECORDED).verdict}.**" in text


def test_verdict_follows_the_observations():
    res = copy.deepcopy(RECORDED)
    unused = res["convert_after_wrap"]["after, find_unused_parameters"]
    unused.update(error=None, max_rank_diff_bn_affine=0.2, max_rank_diff_other=0.0)
    for r in res["all_rank_zero"]["torch alone"]:
        r["exit"] = 1
    assert pitfalls.verdict(res).verdict == "partly"  # silent drift, loud launch failure
    for r in res["all_rank_zero"]["torch alone"]:
        r["exit"] = 0
    assert pitfalls.verdict(res).verdict == "reproduced"  # both would train silently
    unused["max_rank_diff_bn_affine"] = 0.0
    assert pitfalls.verdict(res).verdict == "not reproduced"


def test_report_without_results_is_one_sentence(tmp_path, capsys):
    assert claims.main(["pitfalls", "--report", "--experiments", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("bnlab: error: no ")
