"""bnlab: BatchNorm under data-parallel training.

The public API for your own model (docs/library.md): `convert` and `revert` swap every
BatchNorm layer and keep its state (bnlab.norms); `precise_bn` recomputes the running
statistics on any loader, reduced across ranks (bnlab.precise_bn); `sync_bn_stats` makes the
ranks' running statistics agree at an epoch end (bnlab.bn_sync); `diagnose` measures what a
trained model's BN statistics cost on its data, layer by layer (bnlab.diagnose);
`count_collectives` says which collectives a step issues, the check for evaluation that hangs
when ranks evaluate different numbers of batches (bnlab.collectives).
"""

import sys
import types
from typing import TYPE_CHECKING

# Each name is imported on first use (PEP 562), so that `import bnlab` alone, and the `bnlab`
# command's --help, need not import torch.
_WHERE = {"sync_bn_stats": "bnlab.bn_sync", "count_collectives": "bnlab.collectives",
          "Diagnosis": "bnlab.diagnose", "diagnose": "bnlab.diagnose", "convert": "bnlab.norms",
          "revert": "bnlab.norms", "precise_bn": "bnlab.precise_bn"}

__all__ = ["Diagnosis", "convert", "count_collectives", "diagnose", "precise_bn", "revert",
           "sync_bn_stats"]

if TYPE_CHECKING:
    from bnlab.bn_sync import sync_bn_stats
    from bnlab.collectives import count_collectives
    from bnlab.diagnose import Diagnosis, diagnose
    from bnlab.norms import convert, revert
    from bnlab.precise_bn import precise_bn


class _Package(types.ModuleType):
    """The import system sets each imported submodule on its package. Two share their name
    with the function they export (bnlab.precise_bn, bnlab.diagnose): the function keeps the
    name, as it did when this file imported them eagerly."""

    def __setattr__(self, name: str, value) -> None:
        if name in ("precise_bn", "diagnose") and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name in _WHERE:
        import importlib

        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bnlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
