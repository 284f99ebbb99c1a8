"""Train a ResNet on CIFAR-10 (or the synthetic set) with the normalization under test.

    python train.py                                     # one process, defaults (configs/train.yaml)
    python train.py norm=bn batch_per_gpu=2 dist.nproc_per_node=4   # 4 local DDP ranks
    torchrun --nproc_per_node=4 train.py norm=bn batch_per_gpu=2     # the same, via torchrun
    python train.py -m seed=1,2 dist.nproc_per_node=2   # Hydra multirun of 2-rank jobs
"""

import sys

import hydra

from bnlab import hydra_setup, precheck

hydra_setup.register()


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg) -> None:
    from bnlab import launch  # torch is imported here, after the checks

    launch.main(cfg)


if __name__ == "__main__":
    precheck.check_or_exit(sys.argv[1:])  # one sentence for a typo, before Hydra starts
    main()
