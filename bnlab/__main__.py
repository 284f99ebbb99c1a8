"""`python -m bnlab <command>`: bnlab's tools for any model.

    python -m bnlab doctor --model torchvision:resnet50 --input 3x224x224 --world 8 \\
        --batch-per-rank 2
"""

from __future__ import annotations

import argparse
import sys

from bnlab import doctor
from bnlab.cli import run_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bnlab", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    doctor.add_parser(sub)
    args = parser.parse_args(argv)
    return run_cli(lambda: args.run(args))


if __name__ == "__main__":
    sys.exit(main())
