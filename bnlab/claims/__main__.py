"""`python -m bnlab.claims NAME... | all [--report]`: see bnlab/claims/__init__.py."""

import sys

from bnlab.claims import main

sys.exit(main())
