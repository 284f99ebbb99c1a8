"""`python -m bnlab.claims NAME... | all [--report]`: see bnlab/claims/__init__.py.
`python -m bnlab.claims recover-spec [--data DIR]`: experiments/recover/sweep.yaml from the
pilot's choices (bnlab/claims/frompilot.py); `converge-spec`: experiments/converge/sweep.yaml
from the same choices (bnlab/claims/converge.py); `practice-spec`: experiments/practice/sweep.yaml
from table-practicepilot's choices (bnlab/claims/practice/spec.py)."""

import sys

from bnlab.claims import converge, frompilot, main, practice
from bnlab.cli import run_cli

SPECS = {"recover-spec": frompilot.write_spec, "converge-spec": converge.write_spec,
         "practice-spec": practice.write_spec}

if sys.argv[1:2] and sys.argv[1] in SPECS:
    name, args = sys.argv[1], sys.argv[2:]
    if args not in ([], ) and not (len(args) == 2 and args[0] == "--data"):
        print(f"usage: python -m bnlab.claims {name} [--data DIR]", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_cli(lambda: SPECS[name](data=args[1] if args else None)))
sys.exit(main())
