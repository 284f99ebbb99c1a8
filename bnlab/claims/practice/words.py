"""table-practice in words: the README's finding 2 once its 8 x 2 cells have their seeds (what
to use instead of BN at a practitioner's global batch); table-recover sets the line under it
(recover.words.under_practice). The README's other GroupNorm number (finding 4) says its own
rate and length in its sentence."""

from __future__ import annotations

from bnlab.claims import recover
from bnlab.claims.practice.cells import Practice, bn_states, find, flatness, per_seed
from bnlab.claims.practice.doctor import advice_row
from bnlab.claims.practice.spec import BATCHES, RANKS, RULES
from bnlab.claims.recover.words import best_two
from bnlab.lab import page, rules
from bnlab.lab.results import fmt
from bnlab.lab.table import Finding

# the tables whose findings this one stands in for in the README (their pages stay, linked
# under it as the earlier, smaller-batch protocol: recover.words.under_practice)
REPLACES = ("recover", "converge")
# each fix's name where the finding's word budget wants it shorter than the page's
# a state after its subject: "BN breaks", "BN is unclear", "GroupNorm is flat", "... drops"
IS = {"breaks": "breaks", "holds": "holds", "drops": "drops", "flat": "is flat",
      "unclear": "is unclear"}
SHORT = {**recover.SHORT, "syncbn4": "SyncBN in 4-rank groups", "precise": "PreciseBN",
         "frozen_bn": "frozen BN", "brn": "Batch Renorm"}


def finding(data: Practice) -> list[Finding]:
    """Finding 2 from this table: at 8 x 2, whether BN breaks (its gap to 8 x 16 with its
    interval) and the best fix and the best without per-step communication with their states.
    [] until the advice row exists. BN's and GroupNorm's states across per-rank batches are
    the figure's title, shown beside it."""
    row = advice_row(data)
    if row is None:
        return []
    cells = data.runs.cells
    g, state = bn_states(cells)[2]
    bn, ref = per_seed(find(cells, "bn", 2)), per_seed(find(cells, "bn", BATCHES[0]))
    lost = (f" (it diverged on {len(set(ref) - set(bn))} of {len(ref)} seeds where "
            f"{RANKS} x {BATCHES[0]} did not)" if g["lost"] else
            f", {g['gap']:.1f} points ({fmt(g['lo'])} to {fmt(g['hi'])}) under "
            f"{RANKS} x {BATCHES[0]}")
    answer = (f", within the rule's {RULES['break_points']:g} points, so no fix's share of its "
              "loss is measured") if state == "holds" else f"; {best_two(row, short=SHORT)}"
    text = f"BN {IS[state]} at {RANKS} x 2 on resnet20{lost}{answer}."
    # across the per-rank batches: the figure's title, shown under the list (title()),
    # and the page's line (across())
    return [Finding(text, "practice", rules.mark(RULES), rank=2, replaces=REPLACES)]


def across(data: Practice) -> str:
    """BN's state at each per-rank batch below the reference and whether GroupNorm and
    GroupNorm+WS stay flat, with the runs' length, in a sentence (the page's, over its table
    by images per rank; the figure's title says it in states); "" while any is to come."""
    cells = data.runs.cells
    bn = {b: s for b, (_, s) in bn_states(cells).items()}
    flat = {f: flatness(cells, f)[0] for f in ("gn", "gnws")}
    if "to come" in bn.values() or "to come" in flat.values():
        return ""
    by = {s: [str(b) for b in BATCHES[1:] if bn[b] == s] for s in ("holds", "breaks",
                                                                      "unclear")}
    said = [f"{IS[s]} at {page.listed(bs)}" for s, bs in by.items() if bs]
    epochs = find(cells, "bn", BATCHES[0]).epochs
    return (f"From {RANKS} x {BATCHES[0]} to {RANKS} x 2 (global batch {BATCHES[0] * RANKS} to "
            f"{2 * RANKS}, {epochs} epochs), BN {', '.join(said)} "
            f"images per rank; GroupNorm {IS[flat['gn']]} and GroupNorm+WS {IS[flat['gnws']]} "
            f"(flat: at every per-rank batch less than {RULES['flat_gap']:g} points under its "
            f"own {RANKS} x {BATCHES[0]}, the interval's upper end under "
            f"{RULES['flat_interval']:g}; a gain counts as flat).")
