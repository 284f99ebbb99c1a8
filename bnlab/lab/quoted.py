"""The doctor's outputs that docs/library.md quotes, rewritten from the doctor itself: each
block under `<!-- doctor: ARGS -->` is what `bnlab doctor ARGS` prints today. `make report`
refreshes them once it has written the tables' advice (bnlab/measured/), so the page follows
the measurements it cites; tests/test_doctor.py checks that they are current."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

from bnlab import commands
from bnlab.cli import run_cli
from bnlab.errors import BnlabError
from bnlab.paths import ROOT

LIBRARY = ROOT / "docs" / "library.md"
# the marker line with the doctor's arguments, then the quoted output in a ```text block
QUOTED = re.compile(r"(<!-- doctor: (.*?) -->\n```text\n)(.*?)(\n```)", re.S)


def doctor_output(args: str) -> str:
    """What `python -m bnlab doctor ARGS` prints on stdout, its last newline dropped (the
    doctor's own parser: the entry point sits above the lab, which does not import it). A
    doctor that refuses the arguments, or prints nothing, is an error: no block is rewritten
    with it."""
    parser = argparse.ArgumentParser(prog="python -m bnlab", exit_on_error=False)
    commands.add_doctor(parser.add_subparsers(dest="command", required=True))
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            parsed = parser.parse_args(["doctor", *args.split()])
            code = run_cli(lambda: parsed.run(parsed))
    except (argparse.ArgumentError, SystemExit):
        code = 2
    if code not in (0, 1) or not out.getvalue().strip():  # 1: a layer at risk, as quoted
        raise BnlabError(f"the doctor quoted in {LIBRARY.name} under `<!-- doctor: {args} -->` "
                         f"exited {code} ({err.getvalue().strip() or 'no output'}); mend the "
                         "arguments on that line.")
    return out.getvalue().rstrip("\n")


def quotes(path: Path = LIBRARY) -> list[tuple[str, str]]:
    """Each quoted block of `path`: (the doctor's arguments, the output quoted)."""
    return [(m[2], m[3]) for m in QUOTED.finditer(path.read_text())]


def refresh(path: Path = LIBRARY) -> None:
    """Rewrite every quoted block of `path` with the doctor's output today; the file is left
    alone where nothing changed, and where any block's doctor fails (every output is computed
    before the file is written)."""
    text = path.read_text()
    new = QUOTED.sub(lambda m: m[1] + doctor_output(m[2]) + m[4], text)
    if new != text:
        path.write_text(new)
        print(f"wrote the doctor's outputs quoted in {path}")
