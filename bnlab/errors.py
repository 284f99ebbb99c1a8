"""The one exception type for bad input: a command shows it as one sentence and exits 2."""


class BnlabError(Exception):
    """Bad config, data, checkpoint or environment; printed without a traceback."""
