"""bnlab: BatchNorm under data-parallel training.

The public API for your own model (docs/library.md): `convert` and `revert` swap every
BatchNorm layer and keep its state (bnlab.norms); `precise_bn` recomputes the running
statistics on any loader, reduced across ranks (bnlab.precise_bn).
"""

from bnlab.norms import convert, revert
from bnlab.precise_bn import precise_bn

__all__ = ["convert", "precise_bn", "revert"]
