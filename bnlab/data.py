"""Datasets held on the device as uint8, with a data order that does not depend on the ranks.

Order: every epoch has one seeded permutation of the training set. It is cut into global
micro-batches of `world * batch_per_gpu` images; an optimizer step takes `grad_accum`
consecutive ones, and rank r takes the r-th contiguous chunk of each. Augmentation
parameters are drawn per position in the permutation, so 1 rank x 8 and 4 ranks x 2 see
the same augmented images in the same steps and differ only in how BN groups them.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bnlab.errors import BnlabError

NUM_CLASSES = 10
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILES = ["test_batch"]
FULL_BATCH = 10_000  # images per file in the official archive; checksums apply only then
# data.* keys that build_dataset applies itself (the loaders never see them)
DATA_KEYS = ("train_limit", "val_limit", "holdout", "holdout_seed", "image_size", "augment",
             "rank_skew", "eval_batch")


@dataclass
class Split:
    x: torch.Tensor  # (N, 3, 32, 32) uint8
    y: torch.Tensor  # (N,) int64

    def __len__(self) -> int:
        return len(self.y)

    def to(self, device: torch.device) -> Split:
        return Split(self.x.to(device), self.y.to(device))

    def head(self, n: int) -> Split:
        return self if n <= 0 else Split(self.x[:n], self.y[:n])


@dataclass
class Dataset:
    train: Split
    val: Split
    mean: tuple[float, float, float]  # per-channel, of the training images in [0, 1]
    std: tuple[float, float, float]
    size: int = 32  # the side the model sees: images are resized to it after augmentation
    _scale: dict = field(default_factory=dict, repr=False, compare=False)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 images on the device -> the model's input: in [0, 1], resized to `size`
        (bilinear; the identity at 32), normalized by the training set's mean and std."""
        x = x.float().div_(255)
        if x.shape[-1] != self.size:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear",
                              align_corners=False)
        if x.device not in self._scale:  # made once per device: no copy per batch
            self._scale[x.device] = (torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1),
                                     torch.tensor(self.std, device=x.device).view(1, 3, 1, 1))
        mean, std = self._scale[x.device]
        return (x - mean) / std


# ----------------------------------------------------------------------------------------
# CIFAR-10 in the official python format


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _official_md5() -> dict[str, str]:
    from torchvision.datasets import CIFAR10

    return dict(CIFAR10.train_list + CIFAR10.test_list)


def _read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="latin1")
        x = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        y = np.asarray(d["labels"], dtype=np.int64)
    except Exception as e:  # any unpickling or shape failure means the file is damaged
        raise BnlabError(
            f"data: {path} is corrupt or truncated ({type(e).__name__}); "
            f"delete {path.parent} and download CIFAR-10 again from {CIFAR_URL}."
        ) from None
    if len(x) != len(y) or not ((y >= 0) & (y < NUM_CLASSES)).all():
        raise BnlabError(f"data: {path} has inconsistent images and labels; download it again.")
    if len(x) == FULL_BATCH and _md5(path) != _official_md5().get(path.name):
        raise BnlabError(f"data: {path} fails the official CIFAR-10 checksum; download it again.")
    return x, y


def cifar_missing_message(root: Path) -> str:
    return (
        f"data: CIFAR-10 not found in {root / CIFAR_DIR} and it could not be downloaded; "
        f"download {CIFAR_URL}, extract it into {root} (or point data.root / BNLAB_DATA at "
        f"the folder that holds {CIFAR_DIR})."
    )


def cifar_present(root: Path) -> bool:
    d = root / CIFAR_DIR
    return all((d / f).is_file() for f in TRAIN_FILES + TEST_FILES)


def ensure_cifar10(root: Path, download: bool) -> None:
    """Download through torchvision if missing; one process at a time (file lock)."""
    if cifar_present(root):
        return
    if not download:
        raise BnlabError(cifar_missing_message(root) + " (data.download=false)")
    made = [p for p in (root, *root.parents) if not p.exists()]  # what a failure removes
    lock_path = root / ".bnlab-download.lock"
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not cifar_present(root):
                from torchvision.datasets import CIFAR10

                CIFAR10(str(root), train=True, download=True)
    except Exception:
        if not cifar_present(root):  # leave nothing behind: no lock, no empty folders
            lock_path.unlink(missing_ok=True)
            for p in made:
                if p.is_dir() and not any(p.iterdir()):
                    p.rmdir()
        raise BnlabError(cifar_missing_message(root)) from None


def load_cifar10(root: str, download: bool = True, **_) -> tuple[Split, Split]:
    r = Path(root).expanduser()
    ensure_cifar10(r, download)
    parts = {name: _read_batch(r / CIFAR_DIR / name) for name in TRAIN_FILES + TEST_FILES}

    def cat(names):
        xs, ys = zip(*(parts[n] for n in names), strict=True)
        return Split(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))

    return cat(TRAIN_FILES), cat(TEST_FILES)


# ----------------------------------------------------------------------------------------
# Synthetic: CIFAR-shaped, 10 classes, made by code from a seed (nothing to download)


def make_synthetic(
    num_train: int = 5000, num_val: int = 1000, noise: float = 1.2, seed: int = 0, **_
) -> tuple[Split, Split]:
    """Each class is a smooth random colour pattern; samples add a random shift and noise."""
    g = torch.Generator().manual_seed(10_007 + seed)
    protos = F.interpolate(torch.rand(NUM_CLASSES, 3, 4, 4, generator=g), size=40, mode="bicubic")

    def sample(n: int) -> Split:
        y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
        dy, dx = torch.randint(0, 9, (2, n), generator=g)
        rows = (dy[:, None] + torch.arange(32))[:, None, :, None]
        cols = (dx[:, None] + torch.arange(32))[:, None, None, :]
        img = protos[y[:, None, None, None], torch.arange(3)[None, :, None, None], rows, cols]
        img = img + noise * torch.randn(img.shape, generator=g)
        return Split((img.clamp(0, 1) * 255).round().to(torch.uint8), y)

    return sample(num_train), sample(num_val)


DATASETS: dict[str, Callable[..., tuple[Split, Split]]] = {
    "cifar10": load_cifar10,
    "synthetic": make_synthetic,
}


def holdout(train: Split, n: int, seed: int) -> tuple[Split, Split]:
    """(the rest, `n` held-out images): a validation split carved from the training images,
    stratified (each class's share as in the whole, largest remainders rounded up) and
    seeded; the rest keeps its original order, so its data order is the set's own."""
    if not 0 < n < len(train):
        raise BnlabError(f"data.holdout={n} must be between 1 and {len(train) - 1} "
                         f"(the training set has {len(train)} images), or 0 for none.")
    g = torch.Generator().manual_seed(20_011 + seed)
    perm = torch.randperm(len(train), generator=g)
    counts = torch.bincount(train.y, minlength=NUM_CLASSES).double()
    share = counts * n / len(train)
    quota = share.floor().long()
    left = n - int(quota.sum())
    quota[torch.argsort(share - quota, descending=True, stable=True)[:left]] += 1
    ys = train.y[perm]
    held = torch.cat([perm[ys == c][:int(quota[c])] for c in range(NUM_CLASSES)])
    keep = torch.ones(len(train), dtype=torch.bool)
    keep[held] = False
    held = held.sort().values
    return Split(train.x[keep], train.y[keep]), Split(train.x[held], train.y[held])


def build_dataset(cfg: dict) -> Dataset:
    """Load the dataset named by `cfg['name']` into CPU memory (train/val limits applied).
    With `holdout` > 0 the validation split is that many training images, held out of
    training (protocol choices are made on it, never on the test split)."""
    opts = {k: v for k, v in cfg.items() if k not in ("name", *DATA_KEYS)}
    train, val = DATASETS[cfg["name"]](**opts)
    train = train.head(cfg.get("train_limit", 0))
    if cfg.get("holdout", 0):
        train, val = holdout(train, cfg["holdout"], cfg.get("holdout_seed", 0))
    val = val.head(cfg.get("val_limit", 0))
    xf = train.x.float().div_(255)
    mean = tuple(xf.mean(dim=(0, 2, 3)).tolist())
    std = tuple(xf.std(dim=(0, 2, 3)).tolist())
    return Dataset(train, val, mean, std, cfg.get("image_size", 32))


# ----------------------------------------------------------------------------------------
# Batched augmentation and the layout-independent order


def augment(x: torch.Tensor, offsets: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Random crop with 4-pixel zero padding and horizontal flip, as one gather (uint8 in/out)."""
    b = x.shape[0]
    xp = F.pad(x, (4, 4, 4, 4))
    ar = torch.arange(32, device=x.device)
    rows = offsets[:, 0, None] + ar
    cols = offsets[:, 1, None] + torch.where(flips[:, None], 31 - ar, ar)
    bi = torch.arange(b, device=x.device)[:, None, None, None]
    ci = torch.arange(3, device=x.device)[None, :, None, None]
    return xp[bi, ci, rows[:, None, :, None], cols[:, None, None, :]]


@dataclass
class EpochPlan:
    """The epoch's permutation and per-position augmentation draws (all on CPU, seeded)."""

    perm: torch.Tensor
    offsets: torch.Tensor
    flips: torch.Tensor

    @classmethod
    def make(cls, n: int, seed: int, epoch: int) -> EpochPlan:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(n, generator=g)
        offsets = torch.randint(0, 9, (n, 2), generator=g)
        flips = torch.rand(n, generator=g) < 0.5
        return cls(perm, offsets, flips)


class TrainLoader:
    """Yields, per optimizer step, this rank's `grad_accum` micro-batches (x float, y).

    `rank_skew` (claim C12): each global micro-batch is sorted by label before it is split
    across the ranks, so the ranks see different classes (and batch statistics) while the
    global batch, and so SyncBN's statistics, stay those of the unsorted order.
    """

    def __init__(self, data: Dataset, device: torch.device, batch_per_process: int, world: int,
                 rank: int, grad_accum: int, seed: int, augment: bool,
                 rank_skew: bool = False):
        """`batch_per_process`: the images this process reads per micro-batch: the config's
        batch_per_gpu, times the ranks it simulates (a simulated run reads each global
        micro-batch whole); `world`: the processes."""
        self.data = data
        self.split = data.train.to(device)
        self.labels = data.train.y.cpu()
        self.device = device
        self.b, self.world, self.rank, self.k = batch_per_process, world, rank, grad_accum
        self.seed, self.augment, self.rank_skew = seed, augment, rank_skew

    @property
    def global_micro(self) -> int:
        return self.world * self.b

    @property
    def steps_per_epoch(self) -> int:
        return len(self.split) // (self.global_micro * self.k)

    def positions(self, step: int, micro: int, perm: torch.Tensor | None = None):
        """Positions in the epoch permutation that this rank reads for one micro-batch
        (with `rank_skew`, this rank's share of the global micro-batch sorted by label)."""
        start = (step * self.k + micro) * self.global_micro
        mine = slice(start + self.rank * self.b, start + (self.rank + 1) * self.b)
        if not self.rank_skew or perm is None:
            return mine
        pos = torch.arange(start, start + self.global_micro)
        order = torch.sort(self.labels[perm[pos]], stable=True).indices
        return pos[order][self.rank * self.b:(self.rank + 1) * self.b]

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return self.data.prepare(x)

    def epoch(self, epoch: int, start: int = 0
              ) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
        """The epoch's optimizer steps from step `start` on (a resumed run skips the rest)."""
        plan = EpochPlan.make(len(self.split), self.seed, epoch)
        for step in range(start, self.steps_per_epoch):
            micro = []
            for m in range(self.k):
                pos = self.positions(step, m, plan.perm)
                idx = plan.perm[pos].to(self.device, non_blocking=True)
                x = self.split.x[idx]
                if self.augment:
                    off = plan.offsets[pos].to(self.device, non_blocking=True)
                    flip = plan.flips[pos].to(self.device, non_blocking=True)
                    x = augment(x, off, flip)
                micro.append((self.normalize(x), self.split.y[idx]))
            yield micro


    def images(self, epoch: int, steps: int) -> Iterator[torch.Tensor]:
        """This rank's inputs for `steps` steps from the start of `epoch` (first micro-batch
        each), going on into the next epochs' orders when one epoch has fewer steps."""
        while steps > 0 and self.steps_per_epoch > 0:
            n = min(steps, self.steps_per_epoch)
            for micro in itertools.islice(self.epoch(epoch), n):
                yield micro[0][0]
            steps, epoch = steps - n, epoch + 1


def val_batches(data: Dataset, split: Split, device: torch.device, batch: int, world: int,
                rank: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's contiguous share of the validation set, in batches, normalized."""
    n = len(split)
    lo, hi = n * rank // world, n * (rank + 1) // world
    for s in range(lo, hi, batch):
        e = min(s + batch, hi)
        x = split.x[s:e].to(device, non_blocking=True)
        yield data.prepare(x), split.y[s:e].to(device, non_blocking=True)
