"""How every bnlab command ends: bad input is one sentence on stderr and exit status 2."""

from __future__ import annotations

import sys
from collections.abc import Callable

from bnlab.errors import BnlabError


def run_cli(body: Callable[[], int | None]) -> int:
    """Run a command's body (returning an exit status or None); a BnlabError becomes
    `bnlab: error: <sentence>` on stderr and exit status 2."""
    try:
        return body() or 0
    except BnlabError as e:
        print(f"bnlab: error: {e}", file=sys.stderr)
        return 2
