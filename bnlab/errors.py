"""The one exception type for bad input: its message is shown to the user as one sentence."""


class BnlabError(Exception):
    """Bad config, data, checkpoint or environment; printed without a traceback."""
