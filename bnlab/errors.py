"""The one exception type for bad input: its message is shown to the user as one sentence."""


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
