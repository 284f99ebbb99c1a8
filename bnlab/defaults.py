"""The doctor's and diagnose's defaults, in a module that imports nothing (not torch), so that
`bnlab --help` names them in well under a second."""

MIN_VALUES = 16  # values per channel that a BN layer normalizes over
MIN_IMAGES = 8   # images (samples) per BN group
DOCTOR_KINDS = ("bn", "syncbn")  # what the doctor's --norm converts to before measuring
THRESHOLD = 1.0  # points of the metric: above this cost, the statistics are a problem
