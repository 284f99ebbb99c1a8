"""Data: the official CIFAR-10 format, the synthetic set, and a layout-independent order."""

from __future__ import annotations

import shutil

import pytest
import torch

from bnlab import data as D
from bnlab.errors import BnlabError
from conftest import CIFAR_MINI, needs_cifar


@needs_cifar
def test_reads_cifar10_mini_in_official_format():
    train, val = D.load_cifar10(str(CIFAR_MINI), download=False)
    assert train.x.shape == (5085, 3, 32, 32) and train.x.dtype == torch.uint8
    assert val.x.shape == (1017, 3, 32, 32)
    assert val.y[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]  # as in the full test batch
    means = train.x.float().div(255).mean(dim=(0, 2, 3))
    assert torch.allclose(means, torch.tensor([0.4936, 0.4846, 0.4483]), atol=1e-4)


def test_missing_dataset_offline_says_where_to_put_it(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(BnlabError, match="CIFAR-10 not found.*extract it into"):
        D.load_cifar10(str(tmp_path / "nowhere"), download=True)
    with pytest.raises(BnlabError, match=r"data.download=false"):
        D.load_cifar10(str(tmp_path / "nowhere"), download=False)
    # nothing left behind: no folder made for the download, no lock file
    assert not (tmp_path / "nowhere").exists() and not list(tmp_path.rglob("*.lock"))
    (tmp_path / "there").mkdir()  # an existing folder keeps nothing of the failed attempt
    with pytest.raises(BnlabError, match="CIFAR-10 not found"):
        D.load_cifar10(str(tmp_path / "there"), download=True)
    assert list((tmp_path / "there").iterdir()) == []


@needs_cifar
def test_truncated_batch_file_is_a_clear_error(tmp_path):
    shutil.copytree(CIFAR_MINI / D.CIFAR_DIR, tmp_path / D.CIFAR_DIR)
    f = tmp_path / D.CIFAR_DIR / "data_batch_3"
    f.write_bytes(f.read_bytes()[:5000])
    with pytest.raises(BnlabError, match="data_batch_3 is corrupt or truncated"):
        D.load_cifar10(str(tmp_path), download=False)


def test_synthetic_is_deterministic_and_balanced():
    a, _ = D.make_synthetic(num_train=500, num_val=10)
    b, _ = D.make_synthetic(num_train=500, num_val=10)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert a.x.dtype == torch.uint8 and a.x.shape == (500, 3, 32, 32)
    assert set(a.y.tolist()) == set(range(10))
    c, _ = D.make_synthetic(num_train=500, num_val=10, seed=1)
    assert not torch.equal(a.x, c.x)


def test_augment_matches_a_per_sample_reference():
    x = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    off = torch.randint(0, 9, (5, 2))
    flip = torch.tensor([True, False, True, False, True])
    out = D.augment(x, off, flip)
    for i in range(5):
        ref = torch.nn.functional.pad(x[i], (4, 4, 4, 4))
        ref = ref[:, off[i, 0]:off[i, 0] + 32, off[i, 1]:off[i, 1] + 32]
        if flip[i]:
            ref = ref.flip(-1)
        assert torch.equal(out[i], ref)


def _dataset(n=200):
    train, val = D.make_synthetic(num_train=n, num_val=8)
    return D.Dataset(train, val, (0.5,) * 3, (0.25,) * 3)


def _global_stream(world: int, b: int, k: int, epochs=(0, 1), skew=False):
    """Every micro-batch of every step, ranks concatenated in rank order."""
    data = _dataset()
    loaders = [D.TrainLoader(data, torch.device("cpu"), b, world, r, k, seed=3, augment=True,
                             rank_skew=skew) for r in range(world)]
    out = []
    for e in epochs:
        for steps in zip(*(ld.epoch(e) for ld in loaders), strict=True):
            for m in range(k):
                out.append((torch.cat([s[m][0] for s in steps]),
                            torch.cat([s[m][1] for s in steps])))
    return out


def test_order_and_augmentation_do_not_depend_on_world_size():
    """1x8, 2x4 and 4x2 see the same augmented images in the same steps."""
    ref = _global_stream(1, 8, 1)
    for world, b in [(2, 4), (4, 2), (8, 1)]:
        got = _global_stream(world, b, 1)
        assert len(got) == len(ref)
        for (xa, ya), (xb, yb) in zip(ref, got, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_rank_skew_sorts_each_global_batch_by_label_and_keeps_its_images():
    """data.rank_skew: the ranks' shares are the global batch sorted by label, the same for
    any split into processes (4 real ranks x 2 = 1 process reading 8, as the simulation does),
    and the global batch holds the same augmented images as without skew."""
    plain = _global_stream(1, 8, 1)
    ref = _global_stream(1, 8, 1, skew=True)
    assert len(ref) == len(plain)
    moved = 0
    for (xa, ya), (xs, ys) in zip(plain, ref, strict=True):
        assert torch.equal(ys, ys.sort().values)  # rank 0 gets the lowest labels, and so on
        assert torch.equal(ys.sort().values, ya.sort().values)
        key = lambda x: sorted(map(tuple, x.flatten(1).tolist()))  # noqa: E731
        assert key(xs) == key(xa)  # same images (augmentation follows the image)
        moved += not torch.equal(ya, ys)
    assert moved > len(ref) // 2
    for world, b in [(2, 4), (4, 2)]:
        for (xa, ya), (xb, yb) in zip(ref, _global_stream(world, b, 1, skew=True), strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_grad_accum_keeps_the_micro_batch_sequence():
    """4 ranks x 2 with grad_accum 4 reads the same micro-batches as 1 x 8, four per step."""
    ref = _global_stream(1, 8, 1)
    got = _global_stream(4, 2, 4)
    n = len(got)
    assert n == (200 // 32) * 4 * 2  # whole optimizer steps only, two epochs
    for (xa, ya), (xb, yb) in zip(ref[: n // 2], got[: n // 2], strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_epochs_differ_and_seeds_differ():
    p0, p1 = D.EpochPlan.make(100, 0, 0), D.EpochPlan.make(100, 0, 1)
    assert not torch.equal(p0.perm, p1.perm)
    assert not torch.equal(p0.perm, D.EpochPlan.make(100, 1, 0).perm)
    assert torch.equal(p0.perm, D.EpochPlan.make(100, 0, 0).perm)


def test_images_go_on_into_the_next_epoch_when_one_is_too_short():
    """PreciseBN asking for more images than the training set holds gets them all, the first
    epoch's order followed by the next one's (a 200-image set, batches of 8: 25 per epoch)."""
    ld = D.TrainLoader(_dataset(), torch.device("cpu"), 8, 1, 0, 1, seed=3, augment=False)
    got = list(ld.images(0, 40))
    assert len(got) == 40
    assert all(torch.equal(a, b) for a, b in zip(got[:25], ld.images(0, 25), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(got[25:], ld.images(1, 15), strict=True))


@needs_cifar
def test_holdout_is_a_stratified_seeded_split_of_the_training_images():
    cfg = {"name": "cifar10", "root": str(CIFAR_MINI), "download": False}
    full = D.build_dataset(cfg)
    d = D.build_dataset({**cfg, "holdout": 1000})
    assert (len(d.train), len(d.val)) == (len(full.train) - 1000, 1000)
    # each class held out in its share of the whole, to within one image
    share = torch.bincount(full.train.y, minlength=10) * 1000 / len(full.train)
    assert (torch.bincount(d.val.y, minlength=10) - share).abs().max() < 1
    # the held-out images and the rest are the training set, split: none in both, none lost
    key = lambda s: {bytes(x.numpy()) for x in s.x}  # noqa: E731
    held, rest = key(d.val), key(d.train)
    assert not held & rest and held | rest == key(full.train)
    assert not held & key(full.val)  # the test split is never touched
    again = D.build_dataset({**cfg, "holdout": 1000})
    assert torch.equal(again.val.x, d.val.x)  # seeded: every run holds out the same
    other = D.build_dataset({**cfg, "holdout": 1000, "holdout_seed": 1})
    assert not torch.equal(other.val.y, d.val.y)
    with pytest.raises(BnlabError, match="data.holdout=9000 must be between 1 and"):
        D.build_dataset({**cfg, "holdout": 9000})


def test_image_size_resizes_the_prepared_batch_and_32_is_the_plain_normalization():
    train, val = D.make_synthetic(num_train=16, num_val=8)
    d32 = D.Dataset(train, val, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    x = train.x[:4]
    mean = torch.tensor(d32.mean).view(1, 3, 1, 1)
    std = torch.tensor(d32.std).view(1, 3, 1, 1)
    assert torch.equal(d32.prepare(x), (x.float() / 255 - mean) / std)
    d64 = D.Dataset(train, val, d32.mean, d32.std, size=64)
    y = d64.prepare(x)
    assert y.shape == (4, 3, 64, 64)
    ref = torch.nn.functional.interpolate(x.float() / 255, size=(64, 64), mode="bilinear")
    torch.testing.assert_close(y, (ref - mean) / std)
    ld = D.TrainLoader(d64, torch.device("cpu"), 2, 1, 0, 1, seed=0, augment=True)
    (xb, _), = next(ld.epoch(0))
    assert xb.shape == (2, 3, 64, 64)  # augmented at 32, then resized
    (vb, _), = [next(D.val_batches(d64, val, torch.device("cpu"), 8, 1, 0))]
    assert vb.shape == (8, 3, 64, 64)
