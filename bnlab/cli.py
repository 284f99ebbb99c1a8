"""How every bnlab command ends: bad input is one sentence on stderr and exit status 2."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from bnlab.errors import BnlabError

# The exit statuses of train.py and of the sweeps that run it.
EXIT_FAILED = 1      # a rank failed (error, or a peer died); relaunch to resume
EXIT_BAD_INPUT = 2   # refused before anything started; nothing written
EXIT_DIVERGED = 3    # NaN/inf training loss with on_nan=stop
EXIT_PREEMPTED = 75  # SIGTERM/SIGUSR1/SIGUSR2: checkpointed; relaunch the same command to resume


def run_cli(body: Callable[[], int | None]) -> int:
    """Run a command's body (returning an exit status or None); a BnlabError becomes
    `bnlab: error: <sentence>` on stderr and exit status 2."""
    try:
        return body() or 0
    except BnlabError as e:
        print(f"bnlab: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


def imported(spec: str, flag: str):
    """`<module>:<name>` of `--flag` (the doctor's --model, diagnose's --loader), imported from
    the current folder or the installed packages; refused in one sentence where it cannot be."""
    if ":" not in spec:
        raise BnlabError(f"--{flag} {spec!r} is not <module>:<name>; write it as "
                         f"mypkg.things:make.")
    where, name = spec.split(":", 1)
    sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(where)
    except Exception as e:
        raise BnlabError(f"--{flag} {spec!r}: importing {where!r} failed ({type(e).__name__}: "
                         f"{e}); run from the folder that holds it or install it.") from None
    found = getattr(module, name, None)
    if found is None:
        raise BnlabError(f"--{flag} {spec!r}: {where} has no {name!r}.")
    return found


def add_json(p) -> None:
    """`--json` as every bnlab command takes it: alone, JSON instead of the table on stdout;
    with a path, the table on stdout and the JSON written there."""
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="print JSON instead of the table; with PATH, print the table and write "
                   "the JSON there")


def emit(json_to: str | None, text: str, payload: dict) -> None:
    """The command's report as add_json's --json asks (None: the table alone)."""
    data = json.dumps(payload, indent=1)
    if json_to == "-":
        print(data)
        return
    print(text)
    if json_to:
        Path(json_to).write_text(data + "\n")
        print(f"\nwrote {json_to}")
