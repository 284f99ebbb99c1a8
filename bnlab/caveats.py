"""The doctor's notes beside its fix lines: that they are extrapolated where the input is not
the 32 px CIFAR-10 bnlab measured its fixes on; what others published for the user's layout,
labelled as published (bnlab/measured/published.json); and what bnlab's tables find of the
doctor's thresholds (bnlab/measured/thresholds.json, which `make table-values` writes, and
practice.json's `thresholds`, which `make table-practice` writes). Nothing here types a result.
"""

from __future__ import annotations

from bnlab import advice
from bnlab.defaults import MIN_IMAGES, MIN_VALUES
from bnlab.paths import MEASURED

PUBLISHED = MEASURED / "published.json"  # others' measurements, each with its citation
THRESHOLDS = MEASURED / "thresholds.json"  # make table-values: what it finds of the thresholds
MEASURED_SIDE = 32  # every input bnlab measured its fixes on: CIFAR-10 images, 32 x 32 px
IMAGENET_SIDE = 128  # an input this large or larger is taken for ImageNet-like
VALUES_TABLE = "make table-values: experiments/values/table.md in bnlab's repository"


def extrapolated(shape: tuple[int, ...]) -> str | None:
    """Where the input is not the 32 px CIFAR-10 bnlab measured on, a line that says its fix
    lines are extrapolated; None where it is."""
    h, w = shape[-2:]
    if (h, w) == (MEASURED_SIDE, MEASURED_SIDE):
        return None
    return (f"extrapolated: bnlab measured these fixes on CIFAR-10 at {MEASURED_SIDE} x "
            f"{MEASURED_SIDE} px, not at this input's {h} x {w}")


def published(batch: int, shape: tuple[int, ...]) -> str | None:
    """A published measurement of this layout, labelled as such: Wu and He's BN and GN error at
    this many images per rank, where the input is ImageNet-sized and they measured that
    batch; None otherwise (or where the file is missing)."""
    got = advice.read_json(PUBLISHED) or {}
    e = got.get("wu_he_2018")
    if not e or batch not in e["images_per_rank"] or min(shape[-2:]) < IMAGENET_SIDE:
        return None
    at, top = e["images_per_rank"].index(batch), e["images_per_rank"].index(
        max(e["images_per_rank"]))
    bn, gn = e["error"]["bn"], e["error"]["gn"]
    return (f"published, not measured by bnlab: {e['source']}: at {batch} images per GPU, "
            f"BN {bn[at]}% top-1 error against {bn[top]}% at {max(e['images_per_rank'])} "
            f"({bn[at] - bn[top]:.1f} points lost); GroupNorm {gn[at]}% ({min(gn)} to "
            f"{max(gn)} at every batch)")


def thresholds_judged() -> str:
    """What table-values finds of the doctor's thresholds, at each global batch it measured
    ('not supported at global batch 8 (...), supported at global batch 16'), and where; or
    that it has not judged them yet."""
    got = advice.read_json(THRESHOLDS) or {}
    at = [a for a in got.get("at", []) if isinstance(a, dict) and a.get("answer")]
    practice = (advice.read_json(advice.PRACTICE) or {}).get("thresholds")
    also = "" if not isinstance(practice, dict) else (
        f"; table-practice finds {_them(practice)} {practice['answer']} at global batches "
        f"{practice['global_batches']}{_moved(practice)} ({practice['table']})")
    if not at:
        return f"no table has judged them yet ({VALUES_TABLE})" if not also else also[2:]
    return ("table-values finds them " + "; ".join(f"{a['answer']} at global batch "
                                                 f"{a['global_batch']}" for a in at)
            + f" ({got['table']})" + also)


def _them(practice: dict) -> str:
    """'them' where table-practice judged bnlab's thresholds as they are; the ones it judged
    where its rule doctor_change has since moved them."""
    judged = practice.get("judged")
    if not isinstance(judged, dict) or judged == {"images": MIN_IMAGES, "values": MIN_VALUES}:
        return "them"
    return f"{judged['images']} images and {judged['values']} values"


def _moved(practice: dict) -> str:
    """What table-practice's rule doctor_change gives, where it moves MIN_IMAGES."""
    to = practice.get("change")
    if to is None:
        return ""
    done = "is now" if to == MIN_IMAGES else "moves to"
    return f"; by its rule doctor_change MIN_IMAGES {done} {to}"
