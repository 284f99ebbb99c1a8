"""The harness around the library: sweeps of train.py runs, the runs read back, the jitter
statistics, the `Table` every reported table is, figures and the demo report.

It imports the library (bnlab/*.py) and never bnlab.claims, which imports it.
"""
