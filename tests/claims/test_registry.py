"""The registry of reported tables: one name from the make target to the module to the output
folder, and `make report` rebuilding every committed table, plot and verdict as it is."""

from __future__ import annotations

import re
import shutil

from bnlab import claims
from bnlab.lab import figures
from bnlab.paths import EXPERIMENTS, ROOT


def test_each_table_is_one_module_named_as_its_target_and_its_folder():
    makefile = (ROOT / "Makefile").read_text()
    for name, table in claims.TABLES.items():
        assert table.name == name
        module = ROOT / "bnlab" / "claims" / name  # a module, or a package of a few
        assert module.with_suffix(".py").is_file() != (module / "__init__.py").is_file()
        assert (EXPERIMENTS / name / "table.md").is_file()
        target = table.make.removeprefix("make ")
        assert re.search(rf"^{target}: .*\n\t\$\(CLAIMS\) {name}\n", makefile, re.M), target
    assert "\t$(PY) -m bnlab.claims all --report\n" in makefile


def test_every_claim_has_one_verdict_block_in_the_readme():
    readme = (EXPERIMENTS / "README.md").read_text()
    for marker in {t.marker for t in claims.TABLES.values() if t.claims}:
        assert readme.count(f"<!-- {marker}:begin -->") == 1
    ruled = [c for t in claims.TABLES.values() for c in t.claims]
    assert sorted(set(ruled)) == sorted([f"C{i}" for i in range(1, 14)] + ["L1", "L2"])
    assert sorted(ruled) == sorted(set(ruled))  # one rule per claim: no claim ruled twice


def test_the_report_rebuilds_the_committed_tables_plots_and_verdicts(tmp_path):
    """`make report` from the committed runs and results.json: the same bytes."""
    out = tmp_path / "experiments"
    shutil.copytree(EXPERIMENTS, out, ignore=shutil.ignore_patterns("runs"))
    for f in out.rglob("*"):  # every output emptied, every verdict block cleared
        if f.name == "README.md":
            f.write_text(re.sub(r"(<!-- (\w+):begin -->).*?(<!-- \2:end -->)", r"\1\n\3",
                                f.read_text(), flags=re.S))
        elif f.suffix in (".md", ".png"):
            f.write_bytes(b"")
    figures.PROBLEMS.clear()
    assert claims.main(["all", "--report", "--experiments", str(out)]) == 0
    assert figures.PROBLEMS == []  # every figure's text fits and nothing overlaps
    made = sorted(f.relative_to(out) for f in out.rglob("*") if f.suffix in (".md", ".png"))
    assert made == sorted(f.relative_to(EXPERIMENTS) for f in EXPERIMENTS.rglob("*")
                          if f.suffix in (".md", ".png") and "runs" not in f.parts)
    for rel in made:
        assert (out / rel).read_bytes() == (EXPERIMENTS / rel).read_bytes(), rel


def test_the_settled_tables_read_only_runs_of_committed_code():
    """Sweeps refuse a dirty tree (--allow-dirty is for trials): no run a settled table reads,
    at its start or at any resume, came from uncommitted changes."""
    from bnlab.lab import table

    dirty, n = [], 0
    for name in ("pilot", "lr", "fixes", "values"):
        d = table.runs_data(table.Context(claims.TABLES[name]))
        for r in (r for c in d.cells for r in c.runs):
            n += 1
            commits = [r.info.get("commit") or "?"] + [e.get("commit") or "?"
                                                       for e in r.info.get("resumed", [])]
            dirty += [f"{r.path}: {c}" for c in commits if c == "?" or c.endswith("-dirty")]
    assert n >= 50 and dirty == []  # the committed runs were read, and none is dirty


def test_the_readme_opens_with_the_headline_verdicts_of_experiments_readme():
    """README.md's headline block holds the same claims and verdicts as the headline block
    of experiments/README.md (both written by `make report`)."""
    def verdicts(path, marker):
        block = path.read_text().split(f"<!-- {marker}:begin -->")[1].split(
            f"<!-- {marker}:end -->")[0]
        return re.findall(r"^\| (C\d+) \|.*\*\*([^*]+)\*\*(?: \[†\]\([^)]*\))? \|", block,
                          flags=re.M)

    top = verdicts(ROOT / "README.md", "headline")
    assert top and top == verdicts(EXPERIMENTS / "README.md", "settled")


def test_jobs_default_to_the_specs_here_and_to_every_run_on_slurm(tmp_path):
    from bnlab.lab.make import default_jobs
    from bnlab.lab.plan import Cell, Spec

    def spec(jobs, seeds):
        extra = {} if jobs is None else {"jobs": jobs}
        return Spec("s", "s", "demo", [Cell("a", [], seeds), Cell("b", [], seeds)],
                    tmp_path, extra)

    assert default_jobs([spec(2, [0, 1]), spec(3, [0])], "local") == 3
    assert default_jobs([spec(None, [0])], "local") == 1
    assert default_jobs([spec(2, [0, 1]), spec(3, [0])], "slurm") == 6


def test_tables_that_disagree_on_jobs_cannot_share_a_verdict_block(tmp_path):
    """One wall-time sentence stands under a block of verdicts: its tables must state their
    wall time at the same `jobs:` and `budget:`, else one sentence says which to fix."""
    from dataclasses import replace

    import pytest

    from bnlab.errors import BnlabError
    from bnlab.lab.readme import write_verdicts
    from bnlab.lab.spec import load_spec
    from bnlab.lab.table import RunsData

    lr, fixes = claims.TABLES["lr"], claims.TABLES["fixes"]
    a = load_spec(EXPERIMENTS / "lr" / "sweep.yaml")
    b = load_spec(EXPERIMENTS / "fixes" / "sweep.yaml")
    b = replace(b, extra={**b.extra, "jobs": b.extra.get("jobs", 1) + 1})
    readme = tmp_path / "README.md"
    readme.write_text(f"<!-- {lr.marker}:begin -->\n<!-- {lr.marker}:end -->\n")
    built = [(lr, RunsData(a, [], "t", tmp_path, tmp_path)),
             (fixes, RunsData(b, [], "t", tmp_path, tmp_path))]
    with pytest.raises(BnlabError, match="disagree on `jobs:`"):
        write_verdicts(readme, lr.marker, built)
    assert readme.read_text().count("\n") == 2  # nothing written


def test_the_preliminary_line_says_which_verdicts_can_change(tmp_path):
    """While runs are missing, the line above the verdicts says the ones marked preliminary
    may change; where every verdict is final, that only the findings may."""
    from bnlab.lab.readme import write_verdicts
    from bnlab.lab.results import CellResult
    from bnlab.lab.spec import load_spec
    from bnlab.lab.table import RunsData, Table, Verdict

    spec = load_spec(EXPERIMENTS / "lr" / "sweep.yaml")
    cells = [CellResult(c, [], len(c.seeds)) for c in spec.cells]  # every seed to come
    readme = tmp_path / "README.md"
    for final, verdict, says in (
            (False, "partly", "the verdicts marked preliminary may change (the others"),
            (True, "partly", "only the findings may change: every verdict has every seed"),
            (False, "not run yet", "those not run yet wait for their runs (the others")):
        def verdicts(_, final=final, verdict=verdict):
            return [Verdict("C99", "make table-x", "c", "o", verdict, "w", final=final)]
        t = Table("x", ("C99",), None, None, verdicts)
        readme.write_text("<!-- x:begin -->\n<!-- x:end -->\n")
        write_verdicts(readme, "x", [(t, RunsData(spec, cells, "t", tmp_path, tmp_path))])
        text = readme.read_text()
        assert "**Preliminary:** 0 of the" in text and says in text, text
        assert ("(preliminary)" in text) is (says.startswith("the verdicts marked"))


def test_no_placeholder_survives_in_a_page_or_a_rule():
    """A generated page or a rules file never prints a stand-in for what it should name (a
    commit that 'adds this line', a TODO)."""
    stand_ins = ("the commit that adds", "TODO", "FIXME", "TBD", "XXX")
    pages = [f for f in EXPERIMENTS.rglob("*") if f.suffix in (".md", ".yaml")
             and "runs" not in f.relative_to(EXPERIMENTS).parts[:1]
             and f.name != "sweep.yaml"] + [ROOT / "README.md"]
    found = [f"{f.relative_to(ROOT)}: {s}" for f in pages for s in stand_ins
             if s in f.read_text()]
    assert found == []


_MEASURED = re.compile(r"(?<![\w.])[-+]?\d+\.\d+|\d+(?=%)")  # decimals and percentages
_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def _cited_on(number: str, page: str) -> bool:
    """`number` (as the README prints it) is on `page`, as printed or rounded from a number
    with more decimals there (0.0016 from 0.0015625)."""
    digits = len(number.partition(".")[2])
    want = float(number)
    return any(round(float(x), digits) == want for x in _MEASURED.findall(page))


def test_every_number_a_readme_line_cites_is_on_the_page_it_links():
    """A measured number (a decimal or a percentage) in a README line that links a table page
    appears on that page, so the reader who follows the link finds it."""
    missing = []
    for doc in (ROOT / "README.md", EXPERIMENTS / "README.md"):
        for i, line in enumerate(doc.read_text().splitlines(), 1):
            pages = [doc.parent / p for p in _LINK.findall(line)]
            pages = [p for p in pages if p.is_file() and p.name == "table.md"]
            if not pages:
                continue
            text = "\n".join(p.read_text() for p in pages)
            words = _LINK.sub("]", line)
            missing += [f"{doc.relative_to(ROOT)}:{i}: {n}" for n in _MEASURED.findall(words)
                        if not _cited_on(n, text)]
    assert missing == []
