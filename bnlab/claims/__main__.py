"""`python -m bnlab.claims NAME... | all [--report]`: see bnlab/claims/__init__.py.
`python -m bnlab.claims recover-spec [--data DIR]`: experiments/recover/sweep.yaml from the
pilot's choices (bnlab/claims/recover.py)."""

import sys

from bnlab.claims import main, recover
from bnlab.cli import run_cli

if sys.argv[1:2] == ["recover-spec"]:
    args = sys.argv[2:]
    if args not in ([], ) and not (len(args) == 2 and args[0] == "--data"):
        print("usage: python -m bnlab.claims recover-spec [--data DIR]", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_cli(lambda: recover.write_spec(data=args[1] if args else None)))
sys.exit(main())
