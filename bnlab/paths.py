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


def shown(path: Path) -> Path:
    """`path` relative to the checkout when it lies inside it (as tables print run folders)."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
