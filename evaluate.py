"""Evaluate a trained run: `python evaluate.py run=outputs/train/<stamp>`."""

import sys

import hydra

from bnlab import precheck


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg) -> None:
    from bnlab import evaluation  # torch is imported here, after the checks

    evaluation.main(cfg)


if __name__ == "__main__":
    precheck.check_or_exit(sys.argv[1:], "evaluate")  # one sentence for a typo
    main()
