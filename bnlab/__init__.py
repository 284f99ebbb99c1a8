"""bnlab: BatchNorm under data-parallel training.

The public API for your own model (docs/library.md): `convert` and `revert` swap every
BatchNorm layer and keep its state (bnlab.norms); `precise_bn` recomputes the running
statistics on any loader, reduced across ranks (bnlab.precise_bn); `sync_bn_stats` makes the
ranks' running statistics agree at an epoch end (bnlab.bn_sync); `diagnose` measures what a
trained model's BN statistics cost on its data, layer by layer (bnlab.diagnose);
`count_collectives` says which collectives a step issues, the check for evaluation that hangs
when ranks evaluate different numbers of batches (bnlab.collectives).
"""

from bnlab.bn_sync import sync_bn_stats
from bnlab.collectives import count_collectives
from bnlab.diagnose import Diagnosis, diagnose
from bnlab.norms import convert, revert
from bnlab.precise_bn import precise_bn

__all__ = ["Diagnosis", "convert", "count_collectives", "diagnose", "precise_bn", "revert",
           "sync_bn_stats"]
