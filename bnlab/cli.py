"""How every bnlab command ends: bad input is one sentence on stderr and exit status 2."""

from __future__ import annotations

import sys
from collections.abc import Callable

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
