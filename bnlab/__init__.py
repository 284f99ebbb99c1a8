"""bnlab: BatchNorm under data-parallel training.

The public API for your own model: `convert` and `revert` swap every BatchNorm layer and keep
its state (bnlab.norms).
"""

from bnlab.norms import convert, revert

__all__ = ["convert", "revert"]
