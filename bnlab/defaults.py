"""The doctor's and diagnose's defaults, in a module that imports nothing (not torch), so that
`bnlab --help` names them in well under a second."""

MIN_VALUES = 16  # values per channel that a BN layer normalizes over
# images (samples) per BN group: 4 since table-practice's rule doctor_change (rules.yaml in
# experiments/practice/): over 8 ranks on resnet20, BN held at 8 and 4 images per rank and
# broke at 2, so 8 (Wu and He's 8 per GPU) flagged a batch where BN held
MIN_IMAGES = 4
DOCTOR_KINDS = ("bn", "syncbn")  # what the doctor's --norm converts to before measuring
THRESHOLD = 1.0  # points of the metric: above this cost, the statistics are a problem
