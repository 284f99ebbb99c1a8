"""The repository's folders, named once (every other module takes them from here)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent    # the checkout: train.py, configs/, experiments/
CONFIGS = ROOT / "configs"
EXPERIMENTS = ROOT / "experiments"               # one folder per reported table
RUNS = EXPERIMENTS / "runs"                      # the sweeps' run directories, by data tag
RUNS_CUDA = EXPERIMENTS / "runs-cuda"            # the same on a GPU (make gpu-check): kept apart
BENCH_RESULTS = ROOT / "benchmarks" / "results"  # the benchmark's measurements, per machine
# What the library quotes of bnlab's own measurements, inside the package (it ships in the
# wheel): the targets that measure it write it here (make table-recover: advice.json).
MEASURED = Path(__file__).resolve().parent / "measured"


def need_checkout(what: str) -> None:
    """Refuse, in one sentence, a command that reads or writes the repository's files where
    bnlab runs from an installed wheel (its lab and claims ship, the checkout does not)."""
    if not (ROOT / "train.py").is_file() or not EXPERIMENTS.is_dir():
        from bnlab.errors import BnlabError

        raise BnlabError(f"{what} works in a bnlab checkout (train.py and experiments/ beside "
                         f"bnlab/; none at {ROOT}); run it from a clone of the repository.")


def shown(path: Path) -> Path:
    """`path` relative to the checkout when it lies inside it (as tables print run folders)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
