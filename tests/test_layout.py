"""The package's layers, read from its own imports (top-level and inside functions alike).

    uv run python tests/test_layout.py     # modules, layers, the longest import chain, circles

bnlab/ (the library) never imports bnlab.lab or bnlab.claims; bnlab.lab never imports
bnlab.claims; bnlab.errors imports nothing from bnlab; no module imports itself back through
any chain (no circle).
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

import yaml

PACKAGE = Path(__file__).resolve().parent.parent / "bnlab"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each bnlab module and the bnlab modules it imports anywhere in its text."""
    files = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from bnlab import dist` names the module dist; `from bnlab.x import f`, x.
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                           else node.module for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                if t and t != name and t != "bnlab":
                    deps.add(t)
        graph[name] = deps
    return graph


def layer(module: str) -> str:
    """`claims`, `lab` or `library` (bnlab/*.py); `entry` for `python -m bnlab`, which sits
    above them all."""
    if module == "bnlab.__main__":
        return "entry"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ("lab", "claims") else \
        parts[1] if parts[1:] in (["lab"], ["claims"]) else "library"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of imports (a -> b: a imports b); the graph must have no circle."""

    @cache
    def from_(v: str) -> tuple[str, ...]:
        return (v, *max((from_(w) for w in graph[v]), key=len, default=()))

    return list(max((from_(v) for v in sorted(graph)), key=len))


# -- the tests --------------------------------------------------------------------------------

def test_no_module_imports_itself_back():
    assert circles(import_graph()) == []


def test_imports_go_one_way_library_lab_claims():
    allowed = {"library": {"library"}, "lab": {"library", "lab"},
               "claims": {"library", "lab", "claims"}, "entry": {"library", "lab"}}
    wrong = [f"{a} -> {b}" for a, deps in import_graph().items() for b in deps
             if layer(b) not in allowed[layer(a)]]
    assert wrong == []


def test_the_exception_module_imports_nothing_from_bnlab():
    assert import_graph()["bnlab.errors"] == set()


def test_the_graph_reader_sees_circles_and_chains(tmp_path):
    pkg = tmp_path / "bnlab"
    (pkg / "lab").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "lab" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from bnlab.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from bnlab import a\n")
    (pkg / "lab" / "c.py").write_text("import bnlab.a\n")
    g = import_graph(pkg)
    assert g["bnlab.a"] == {"bnlab.b"} and g["bnlab.b"] == {"bnlab.a"}
    assert circles(g) == [["bnlab.a", "bnlab.b"]]
    (pkg / "b.py").write_text("X = 1\n")
    g = import_graph(pkg)
    assert circles(g) == [] and longest_chain(g) == ["bnlab.lab.c", "bnlab.a", "bnlab.b"]
    assert [layer(m) for m in ("bnlab.a", "bnlab.lab.c", "bnlab.lab")] == \
        ["library", "lab", "lab"]


if __name__ == "__main__":
    g = import_graph()
    by_layer: dict[str, list[str]] = {}
    for m in sorted(g):
        by_layer.setdefault(layer(m), []).append(m)
    for name, mods in by_layer.items():
        print(f"{name}: {len(mods)} modules")
    found = circles(g)
    print(f"circles: {len(found)}" + "".join(f"\n  {' <-> '.join(c)}" for c in found))
    if not found:
        chain = longest_chain(g)
        print(f"longest import chain ({len(chain)} modules): {' -> '.join(chain)}")


def test_readme_and_make_help_quote_the_same_times():
    """Every `make X` whose help line quotes a time (`~N min`) and that the README's first
    screen times too: the same number in both."""
    root = PACKAGE.parent
    makefile = (root / "Makefile").read_text()
    helps = dict(re.findall(r"^([\w-]+):.*?## .*?~([\d.]+) min", makefile, flags=re.M))
    readme = (root / "README.md").read_text()
    checked = set()
    for target, minutes in helps.items():
        for para in readme.split("\n\n"):
            if f"`make {target}` " in para and re.search(r"\d minutes", para):
                whole = rf"(?<![\d.]){re.escape(minutes)} minutes"  # 5 is not 2.5
                assert re.search(whole, para), (target, minutes)
                checked.add(target)
    assert {"test", "demo"} <= checked


def test_the_readme_is_short_and_opens_with_the_two_commands():
    """A newcomer's README: about 200 lines at most, `make test` and `make demo` on its first
    screen (the first 25 lines), the long material in docs/."""
    lines = (PACKAGE.parent / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    first = "\n".join(lines[:25])
    assert "make test" in first and "make demo" in first
    assert all((PACKAGE.parent / "docs" / f).is_file()
               for f in ("training.md", "library.md", "sweeps.md"))


def test_the_experiments_index_is_at_most_250_lines_and_lists_every_swept_table():
    """experiments/README.md, the index of every table: at most 250 lines (the words issue's
    budget), and every table that `make` builds (a folder with a sweep.yaml) has its row."""
    root = PACKAGE.parent / "experiments"
    text = (root / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    missing = [d.name for d in sorted(root.iterdir()) if (d / "sweep.yaml").is_file()
               and not re.search(rf"make table-{re.escape(d.name)}(?![\w-])", text)]
    assert not missing, missing


def sentences(markdown: str) -> list[str]:
    """The prose sentences of a Markdown page: code blocks, tables, figures and comments left
    out, a list item its own paragraph, bold marks dropped."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    kept = [ln for ln in text.splitlines() if not ln.startswith(("|", "<!--", "!["))]
    paras = re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", "\n".join(kept))
    out = []
    for p in paras:
        p = " ".join(p.replace("**", "").split())
        out += [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", p) if s]
    return out


def test_no_readme_sentence_runs_over_40_words():
    """A newcomer finishes every sentence: none over 40 words outside tables and code (the
    findings included)."""
    long = [s for s in sentences((PACKAGE.parent / "README.md").read_text())
            if len(s.split()) > 40]
    assert not long, long
    assert sentences("One. Two words here.\n\n- a b. C d\n\n```\nx y z.\n```\n| t |") == [
        "One.", "Two words here.", "- a b.", "C d"]


def test_the_library_imports_nothing_of_the_trainers_or_the_labs_packages():
    """`pip install bnlab` (no extra) carries torch, numpy, pyyaml and tqdm: what a user's own
    training imports of bnlab, the doctor and diagnose load nothing more. In the same process,
    the modules of train.py's Hydra callbacks (configs/train.yaml, which Hydra imports at
    every start, a multirun's or not) leave matplotlib unloaded: a second of each start."""
    import subprocess
    import sys

    targets = [c["_target_"].rsplit(".", 1)[0] for c in yaml.safe_load(
        (PACKAGE.parent / "configs/train.yaml").read_text())["hydra"]["callbacks"].values()]
    code = ("import sys, bnlab, bnlab.doctor, bnlab.diagnose, bnlab.evaluation, bnlab.advice; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'hydra', "
            "'omegaconf', 'wandb', 'submitit', 'matplotlib', 'torchvision'})))\n"
            f"import importlib\nfor t in {targets!r}:\n    importlib.import_module(t)\n"
            "print('matplotlib' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.split("\n")[:2] == ["", "False"], p.stdout + p.stderr
    assert targets == ["bnlab.lab.runs"]  # the callbacks were found


def test_the_commands_help_imports_neither_torch_nor_the_lab():
    """`bnlab --help` answers at once: its parsers (bnlab/commands.py) and `import bnlab` load
    torch only when a command runs or a name is first used."""
    import subprocess
    import sys

    code = ("import sys, bnlab.__main__ as m\ntry:\n    m.main(['doctor', '--help'])\n"
            "except SystemExit:\n    pass\nprint(sorted({'torch', 'matplotlib', 'hydra'} & "
            "{k.split('.')[0] for k in sys.modules}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("[]"), p.stdout + p.stderr
    assert "--batch-per-rank" in p.stdout and "(default 16)" in p.stdout


def test_each_readme_finding_and_each_line_under_it_is_at_most_45_words():
    """The words issue's budget on the README's findings: each numbered finding, and each line
    set under one, at most 45 words as read (each link's target dropped, its text kept)."""
    from bnlab.lab.readme import prose  # the findings section as its budget reads it

    lines = [ln.strip() for ln in prose((PACKAGE.parent / "README.md").read_text())
             if re.match(r"(\d+\.|\s+-) ", ln)]
    assert len([ln for ln in lines if ln[0].isdigit()]) == 5  # the five findings
    long = [ln for ln in lines if len(ln.split(" ", 1)[1].split()) > 45]
    assert not long, long
