"""`bnlab <command>` (or `python -m bnlab <command>`): bnlab's tools for any model and any runs.

    python -m bnlab doctor --model torchvision:resnet50 --input 3x224x224 --world 8 \\
        --batch-per-rank 2
    python -m bnlab diagnose --model mypkg.models:make_net --checkpoint ckpt.pt \\
        --loader mypkg.data:train_loader --batch-per-rank 2   # what BN's statistics cost
    python -m bnlab runs outputs/train/multirun_<stamp>        # a table across the runs
    python -m bnlab plot outputs/train/multirun_<stamp> --out runs.png
    python -m bnlab runs verify RUN [--steps 50] [--as-recorded]  # re-run it: the same floats?

The entry point sits above the layers: it may reach the harness (bnlab.lab) for the runs'
tools; nothing in the library imports it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bnlab import commands
from bnlab.cli import run_cli


def main(argv: list[str] | None = None) -> int:
    prog = "bnlab" if sys.argv and Path(sys.argv[0]).name == "bnlab" else "python -m bnlab"
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["runs", "verify"]:  # `runs DIR...` takes paths: verify is its own parser
        from bnlab.lab import verify  # re-runs train.py: the train extra

        return run_cli(lambda: verify.main(argv[2:], prog))
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands.add_doctor(sub)
    commands.add_diagnose(sub)
    commands.add_runs(sub)
    parser.set_defaults(prog=prog)  # messages name the command as the user ran it
    args = parser.parse_args(argv)
    return run_cli(lambda: args.run(args))


if __name__ == "__main__":
    sys.exit(main())
