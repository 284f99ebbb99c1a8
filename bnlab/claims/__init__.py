"""The reported tables, one module each, named as its make target and its experiments/ folder.

    python -m bnlab.claims NAME... | all [--report] [--data DIR] [--jobs N] [--runs DIR]

`make table-sync` -> bnlab/claims/sync.py -> experiments/sync/ (table.md, sync.png,
results.json). Each module exports one `Table` (bnlab.lab.table): what it trains and measures,
how it renders, its plot, and the rules of its claims' verdicts, written beside it.
Two modules are no table: ddpcheck.py is the jitter table's measurement of real DDP against the
simulation; frompilot.py writes table-recover's and table-converge's specs from
table-recoverpilot's choices.
"""

from __future__ import annotations

from bnlab.claims import (
    batch,
    bf16ddp,
    converge,
    decompose,
    evalmode,
    fixes,
    jitter,
    losslog,
    lr,
    lrpilot,
    pilot,
    pitfalls,
    plateau,
    practice,
    practicepilot,
    precisebn,
    ranks,
    rankstats,
    recover,
    recoverpilot,
    sync,
    values,
)
from bnlab.lab import make, table

TABLES: dict[str, table.Table] = {m.TABLE.name: m.TABLE for m in (
    jitter, batch, ranks, evalmode, rankstats, sync, precisebn, losslog, pitfalls, lrpilot, plateau,
    decompose, pilot, lr, fixes, values, bf16ddp, recoverpilot, recover, converge, practicepilot,
    practice)}


def main(argv: list[str] | None = None) -> int:
    from bnlab.cli import run_cli
    from bnlab.paths import need_checkout

    return run_cli(lambda: need_checkout("python -m bnlab.claims") or make.main(TABLES, argv))
