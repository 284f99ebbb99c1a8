"""Which torch.distributed collectives a block of code issues: the check for evaluation that
hangs when ranks evaluate different numbers of batches (pytorch/pytorch#48988).

    with bnlab.count_collectives() as seen:
        model.eval()
        model(x)                       # one evaluation step, as your loop runs it
    print(seen.say())                  # none, or which collectives and the fix

A collective waits for every rank of its group. An evaluation forward that issues one (DDP's
buffer broadcast, when the wrapper runs with gradients on; SyncBN left in train mode) makes the
rank with more batches wait for a partner that has finished: a hang. The count wraps the
collectives torch.distributed exports (DDP's, SyncBN's and bnlab's own go through them); code
that imported a collective by name before the block is not counted.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Iterator

import torch.distributed as tdist

# what a forward can issue; _broadcast_coalesced is DDP's buffer (and parameter) sync
NAMES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
         "all_to_all", "all_to_all_single", "barrier", "broadcast", "broadcast_object_list",
         "gather", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
         "_broadcast_coalesced")
WHY = {"_broadcast_coalesced": "DDP's buffer sync"}


class Seen(Counter):
    """The collectives a block issued, by name."""

    def say(self) -> str:
        """One line: none, or which collectives a step issued and the fix."""
        if not self:
            return "this step issues no collective: ranks may evaluate different numbers of batches"
        what = ", ".join(f"{n} x{k}" + (f" ({WHY[n]})" if n in WHY else "")
                         for n, k in sorted(self.items()))
        return (f"this step issues {sum(self.values())} collective(s), {what}: ranks that "
                "evaluate different numbers of batches hang (the rank with more waits for one "
                "that has finished); evaluate the unwrapped model (model.module) under "
                "torch.no_grad(), with its BN layers in eval mode")


@contextlib.contextmanager
def count_collectives() -> Iterator[Seen]:
    """Count the torch.distributed collectives issued inside the block (module's docstring)."""
    seen, saved = Seen(), {}
    for name in NAMES:
        fn = getattr(tdist, name, None)
        if fn is None:
            continue
        saved[name] = fn

        @functools.wraps(fn)
        def counted(*args, _name=name, _fn=fn, **kw):
            seen[_name] += 1
            return _fn(*args, **kw)

        setattr(tdist, name, counted)
    try:
        yield seen
    finally:
        for name, fn in saved.items():
            setattr(tdist, name, fn)
