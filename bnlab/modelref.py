"""A model named on the command line, as `bnlab doctor --model` and `evaluate.py doctor.*` take
it: `torchvision:<name>`, `bnlab:<name>` (bnlab's models), `<module>:<factory>` (a function
that returns the model, imported from the current directory or the installed packages), or a
bnlab checkpoint / run directory; and `--input`'s shape of one sample. Bad names get one
sentence (BnlabError).
"""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from bnlab.cli import imported
from bnlab.errors import BnlabError


def load_model(spec: str) -> tuple[nn.Module, str | None]:
    """The model named by `--model`, and its input shape where the spec knows it."""
    path = Path(spec)
    if path.is_dir() or spec.endswith((".pt", ".pth")):
        return _from_checkpoint(path)
    if ":" not in spec:
        raise BnlabError(f"--model {spec!r} is neither torchvision:<name>, bnlab:<name>, "
                         f"<module>:<factory> nor a checkpoint; write one of those.")
    where, name = spec.split(":", 1)
    if where == "torchvision":
        try:
            import torchvision
        except ModuleNotFoundError:
            raise BnlabError(f"--model {spec!r} needs torchvision, which is not installed; "
                             "install it (pip install torchvision, or pip install "
                             "'bnlab[train]').") from None
        if name not in torchvision.models.list_models():
            raise BnlabError(f"--model {spec!r}: torchvision has no model {name!r}; see "
                             f"torchvision.models.list_models().")
        try:
            return torchvision.models.get_model(name, weights=None), None
        except Exception as e:
            raise BnlabError(f"--model {spec!r}: torchvision could not build it "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); build it in "
                             f"a factory and pass --model <module>:<factory>.") from None
    if where == "bnlab":
        from bnlab.models import MODELS, build_model
        if name not in MODELS:
            raise BnlabError(f"--model {spec!r}: bnlab has no model {name!r}; choose one of "
                             f"{sorted(MODELS)}.")
        return build_model(name), "3x32x32"
    factory = imported(spec, "model")
    try:
        model = factory if isinstance(factory, nn.Module) else factory()
    except Exception as e:
        raise BnlabError(f"--model {spec!r}: calling {name}() failed ({type(e).__name__}: {e}); "
                         f"give a factory that takes no arguments.") from None
    if not isinstance(model, nn.Module):
        raise BnlabError(f"--model {spec!r}: {name}() returned a {type(model).__name__}, "
                         f"not a torch.nn.Module.")
    return model, None


def _from_checkpoint(path: Path) -> tuple[nn.Module, str | None]:
    import yaml

    from bnlab import checkpoint
    from bnlab.net import build_net
    state = checkpoint.load(path)
    if not isinstance(state, dict) or "config" not in state or "model" not in state:
        raise BnlabError(f"--model {path}: not a bnlab checkpoint (no config and model); for "
                         f"your own model pass --model <module>:<factory>.")
    cfg = yaml.safe_load(state["config"])
    model = build_net(cfg)
    model.load_state_dict(checkpoint.model_state(state["model"]), strict=False)
    return model, "3x32x32"


def parse_input(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(d < 1 for d in shape):
        raise BnlabError(f"--input {text!r} is not a shape; write the sizes of one sample "
                         f"joined by x, e.g. 3x224x224 (no batch dimension).")
    return shape
