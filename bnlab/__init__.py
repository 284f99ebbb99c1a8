"""bnlab: BatchNorm under data-parallel training."""
