"""The one exception type for bad input (shown as one sentence, exit 2), and the tables' command
line plumbing around it."""


class BnlabError(Exception):
    """Bad config, data, checkpoint or environment; printed without a traceback."""


def run_cli(body) -> int:
    """Run a command's body (returning an exit status or None): bad input becomes one
    sentence on stderr and exit status 2."""
    import sys

    try:
        return body() or 0
    except BnlabError as e:
        print(f"bnlab: error: {e}", file=sys.stderr)
        return 2


def results(path, report: bool, measure, target: str) -> dict:
    """`path` (a results.json) read back with `report`, else measured (with the seconds the
    measuring took, training included, as `measure_s`) and saved."""
    import json
    import time

    if report:
        if not path.is_file():
            raise BnlabError(f"no {path}; run `{target}` first.")
        return json.loads(path.read_text())
    t0 = time.perf_counter()
    res = measure()
    res["measure_s"] = round(time.perf_counter() - t0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1) + "\n")
    return res


def table_main(argv, doc: str, out, target: str, measure, write) -> int:
    """The command line of a table measured on runs (evalmode, rankstats, sync, precisebn):
    `--data/--jobs/--runs` to train what is missing and measure, `--report` to rebuild the
    table from `out`/results.json only."""
    import argparse
    from pathlib import Path

    from bnlab.sweep import RUNS

    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--data", help="folder holding cifar-10-batches-py (no download)")
    p.add_argument("--jobs", type=int, default=1, help="training runs side by side")
    p.add_argument("--runs", type=Path, default=RUNS, help="folder of run directories")
    p.add_argument("--report", action="store_true", help="table from results.json only")
    a = p.parse_args(argv)
    return run_cli(lambda: write(results(
        out / "results.json", a.report, lambda: measure(a.data, a.jobs, a.runs), target)))
