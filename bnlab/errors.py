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
