"""Plain DDP training of a torchvision model with bnlab's public API (not bnlab's trainer).

The three steps a user adds to their own script: check which BN layers get too few samples
(`bnlab.doctor.check`), convert BN to SyncBN keeping any trained state (`bnlab.convert`), and
recompute the BN statistics before evaluating (`bnlab.precise_bn`). CPU/gloo or CUDA/NCCL:

    torchrun --nproc_per_node=2 examples/ddp_own_model.py                 # random images
    torchrun --nproc_per_node=4 examples/ddp_own_model.py --data ../shared/data/cifar10-mini \
        --steps 300
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import bnlab
from bnlab.doctor import check


def datasets(root: str | None, n_random: int = 512):
    """CIFAR-10 from `root` (no download), or random images with random labels."""
    if root is None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n_random, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (n_random,), generator=g)
        return TensorDataset(x, y), TensorDataset(x[:128], y[:128])
    t = torchvision.transforms.Compose([torchvision.transforms.ToTensor(),
                                        torchvision.transforms.Normalize((0.5,) * 3, (0.25,) * 3)])
    make = torchvision.datasets.CIFAR10
    return make(root, train=True, transform=t), make(root, train=False, transform=t)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="folder holding cifar-10-batches-py (default: random images)")
    p.add_argument("--batch-per-rank", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.02)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else "cpu"
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torchvision.models.resnet18(num_classes=10)

    # 1. Before training: which BN layers would see too few samples, and the fix.
    risky, fixes = check(model, (3, 32, 32), world, args.batch_per_rank)
    if rank == 0 and risky:
        print(f"{len(risky)} BN layers at risk at {world} x {args.batch_per_rank}; fixes:",
              *fixes, sep="\n  ")

    # 2. Convert before wrapping in DDP; weights and BN statistics are kept as they are.
    model = DDP(bnlab.convert(model, "syncbn").to(device))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)

    train, val = datasets(args.data)
    sampler = DistributedSampler(train, seed=0)
    loader = DataLoader(train, batch_size=args.batch_per_rank, sampler=sampler, drop_last=True)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if rank == 0 and (step % 10 == 0 or step == args.steps):
                print(f"step {step}  loss {loss.item():.3f}")
            if step == args.steps:
                break
        epoch += 1

    # 3. PreciseBN: each rank passes its own share; all end with the statistics of the union.
    share = DataLoader(train, batch_size=32, sampler=DistributedSampler(train, shuffle=False))
    bnlab.precise_bn(model.module, share, num_samples=1024 // world)

    model.eval()
    val_share = DataLoader(val, batch_size=128, sampler=DistributedSampler(val, shuffle=False))
    right = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in val_share:
            right += torch.tensor([(model(x.to(device)).argmax(1) == y.to(device)).sum(),
                                   len(y)], device=device)
    dist.all_reduce(right)
    if rank == 0:
        print(f"val acc after PreciseBN: {100 * right[0] / right[1]:.2f}% "
              f"({int(right[1])} images, {world} ranks)")


if __name__ == "__main__":
    main()
    # After main() returns: DDP and the loaders are gone while the process group still lives
    # (tearing the group down first left a rank hanging at exit now and then, on gloo).
    dist.destroy_process_group()
