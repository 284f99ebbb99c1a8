"""bnlab: BatchNorm under data-parallel training.

The public API for your own model (docs/library.md): `convert` and `revert` swap every
BatchNorm layer and keep its state (bnlab.norms); `precise_bn` recomputes the running
statistics on any loader, reduced across ranks (bnlab.precise_bn); `sync_bn_stats` makes the
ranks' running statistics agree at an epoch end (bnlab.bn_sync).
"""

from __future__ import annotations

import importlib

# Each public name and its module, imported on first use: `import bnlab.lab.jobs` (what a
# sweep's job process unpickles) then does not import torch.
_API = {"convert": "bnlab.norms", "revert": "bnlab.norms", "precise_bn": "bnlab.precise_bn",
        "sync_bn_stats": "bnlab.bn_sync"}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'bnlab' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
