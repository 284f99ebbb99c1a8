"""Evaluate a trained run: `python evaluate.py run=outputs/train/<stamp>`."""

import hydra

from bnlab import evaluation


@hydra.main(version_base="1.3", config_path="configs", config_name="evaluate")
def main(cfg) -> None:
    evaluation.main(cfg)


if __name__ == "__main__":
    main()
