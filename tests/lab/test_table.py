"""The tables' one command line: train a table's sweep, measure, write table.md, the plot and
the verdict; `--report` rebuilds from what was kept; bad input is one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bnlab.errors import BnlabError
from bnlab.lab.make import main
from bnlab.lab.readme import write_headline
from bnlab.lab.table import Context, Table, Verdict
from bnlab.rundir import read_status

# the tiny table's page: its render, then the claims it rules on (lab.table.verdict_section)
PAGE = ("measured 2 cells; a: 1 run, b: 1 run\n\n## The claims this page rules on\n\n"
        "- C99 (claimed): **reproduced**. ours\n")


def tiny_table(tmp_path: Path) -> Table:
    """A table over two tiny runs on generated data (the sweep's real code path)."""
    spec = tmp_path / "specs" / "tiny" / "sweep.yaml"
    spec.parent.mkdir(parents=True)
    ov = ("[model=resnet20, data=synthetic, data.num_train=32, data.num_val=16, epochs=1, "
          "batch_per_gpu=4, eval_every=1, dist.simulate=2, diagnostics.enabled=false{}]")
    spec.write_text("experiment: demo\nseeds: [0]\ncells:\n"
                    f"  - {{label: a, overrides: {ov.format('')}}}\n"
                    f"  - {{label: b, overrides: {ov.format(', norm=gn, norm.cap_groups=true')}}}"
                    "\n")

    def measure(ctx: Context) -> dict:  # what a table measures on its finished runs
        return {"finished": sum(bool(c.runs) for c in ctx.cells())}

    def load(ctx: Context) -> tuple[dict, list]:
        return ctx.results(), ctx.cells()

    def render(data) -> str:
        res, cells = data
        return f"measured {res['finished']} cells; " + ", ".join(
            f"{c.cell.label}: {len(c.runs)} run" for c in cells)

    def verdicts(data) -> list[Verdict]:
        return [Verdict("C99", "make table-tiny", "claimed", "ours", "reproduced", "why")]

    return Table("tiny", ("C99",), load, render, verdicts, measure=measure, spec=spec)


def test_a_table_trains_measures_and_writes_then_rebuilds_from_what_it_kept(tmp_path, capsys):
    """`make tables` in small: the table's sweep runs as submitit jobs on this machine."""
    table = tiny_table(tmp_path)
    args = ["tiny", "--jobs", "2", "--runs", str(tmp_path / "runs"), "--experiments",
            str(tmp_path / "exp")]
    assert main({"tiny": table}, args) == 0
    out = tmp_path / "exp" / "tiny"
    assert (out / "table.md").read_text() == PAGE
    res = json.loads((out / "results.json").read_text())
    assert res["finished"] == 2 and res["measure_s"] > 0
    assert all(read_status(d) == "completed"
               for d in (tmp_path / "runs" / "synthetic-32").glob("*/seed0"))
    # each run was one submitit job, which reported back (in this sweep command's folder)
    jobs = list((tmp_path / "runs" / "synthetic-32" / ".submitit").glob("*/*/*_result.pkl"))
    assert len(jobs) == 2
    readme = (tmp_path / "exp" / "README.md").read_text()
    assert "<!-- c99:begin -->" in readme and "| C99 | `make table-tiny` |" in readme
    (out / "table.md").unlink()
    assert "running 2 with 2 job(s)" in capsys.readouterr().out  # the first call trained
    assert main({"tiny": table}, [*args, "--report"]) == 0  # no sweep, no measuring
    assert "runs already done" not in capsys.readouterr().out
    assert (out / "table.md").read_text() == PAGE
    assert json.loads((out / "results.json").read_text()) == res


def test_bad_input_is_one_sentence_and_writes_nothing(tmp_path, capsys):
    table = tiny_table(tmp_path)
    exp = tmp_path / "exp"
    assert main({"tiny": table}, ["tiny", "--report", "--experiments", str(exp)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bnlab: error: no ") and "run `make table-tiny` first" in err
    assert main({"tiny": table}, ["tiny", "--jobs", "0", "--experiments", str(exp)]) == 2
    assert capsys.readouterr().err == "bnlab: error: --jobs=0 must be at least 1.\n"
    assert not exp.exists()


def test_the_headline_block_opens_the_readme_and_is_replaced_in_place(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# p\n\n<!-- headline:begin -->\nold\n<!-- headline:end -->\n\n## Rest\n")
    vs = [Verdict("C1", "make table-x", "bn ±10", "bn 3.5, syncbn 4.3", "not reproduced",
                        "why"), Verdict("C6", "make table-x", "frozen", "-", "not run yet",
                                              "")]
    write_headline(readme, ["experiments/x/x.png"], vs, "**Preliminary:** 2 of 4. ")
    text = readme.read_text()
    assert "old" not in text and text.startswith("# p\n") and text.endswith("## Rest\n")
    assert "![x](experiments/x/x.png)" in text and "**Preliminary:** 2 of 4." in text
    assert "| C1 | bn ±10 | bn 3.5, syncbn 4.3 | **not reproduced (preliminary)** |" in text
    assert "| C6 | frozen | - | **not run yet** |" in text  # nothing to mark
    write_headline(readme, ["experiments/x/x.png"], vs[:1], "")
    assert readme.read_text().count("headline:begin") == 1 and "C6" not in readme.read_text()
    assert "| C1 | bn ±10 | bn 3.5, syncbn 4.3 | **not reproduced** |" in readme.read_text()
    vs[0].final = True  # no seed still to come can change it: not preliminary, sweep or not
    write_headline(readme, ["experiments/x/x.png"], vs, "**Preliminary:** 2 of 4. ")
    assert "| C1 | bn ±10 | bn 3.5, syncbn 4.3 | **not reproduced** |" in readme.read_text()


def test_the_headline_is_refused_where_its_markers_are_missing(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# p\n<!-- headline:begin -->\n")
    with pytest.raises(BnlabError, match="lacks the lines"):
        write_headline(readme, [], [], "")
    assert readme.read_text() == "# p\n<!-- headline:begin -->\n"  # nothing written


def test_a_host_name_shared_by_two_machines_names_both_where_a_run_does_not_say(
        tmp_path, monkeypatch):
    from bnlab.lab import sweep as sweep_mod
    from bnlab.lab.page import run_machines
    from bnlab.lab.results import Run

    (tmp_path / "hosts.json").write_text(json.dumps({"vm": "old cpu"}))  # the older format
    monkeypatch.setattr(sweep_mod.socket, "gethostname", lambda: "vm")
    for m in ("new cpu", "new cpu"):
        monkeypatch.setattr(sweep_mod, "machine", lambda m=m: m)
        sweep_mod.record_host(tmp_path)
    hosts = sweep_mod.read_hosts(tmp_path)
    assert hosts == {"vm": ["old cpu", "new cpu"]}
    guess = 'host vm, machine not recorded per run: "old cpu" or "new cpu"'
    assert run_machines(Run(tmp_path, "completed", info={"host": "vm"}), hosts) == [guess]
    # An older start resumed since: the guess for the start, the resume's own machine.
    mixed = Run(tmp_path, "completed", info={"host": "vm", "resumed": [
        {"host": "vm", "machine": "new cpu"}, {"host": "box"}]})
    assert run_machines(mixed, hosts) == [
        guess, "new cpu", "host box, machine not recorded per run: unknown"]
    named = Run(tmp_path, "completed", info={"host": "vm", "machine": "new cpu",
                                             "resumed": [{"machine": "new cpu"}]})
    assert run_machines(named, hosts) == ["new cpu"]
    # Even one machine known under the name is a guess for a run that did not say.
    one = {"vm": ["old cpu"]}
    assert run_machines(Run(tmp_path, "completed", info={"host": "vm"}), one) == [
        'host vm, machine not recorded per run: "old cpu"']
