"""Evaluate a saved run: eval-mode accuracy of its checkpoint on the validation set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from omegaconf import DictConfig

from bnlab import checkpoint, dist
from bnlab.data import build_dataset
from bnlab.errors import BnlabError
from bnlab.trainer import build_net, evaluate


def run(cfg: DictConfig) -> dict:
    path = Path(cfg.run)
    state = checkpoint.load(path)
    train_cfg = yaml.safe_load(state["config"])
    if cfg.data_root is not None:
        train_cfg["data"]["root"] = cfg.data_root
    env = dist.DistEnv(0, 1, 0, dist.pick_device(cfg.device, 0), None)
    data = build_dataset(train_cfg["data"])
    model = build_net(train_cfg)
    model.load_state_dict(state["model"])  # rank 0's statistics, as DDP keeps them
    model.to(env.device)
    res = evaluate(model, data, data.val.to(env.device), env, cfg.eval_batch)
    out = {"checkpoint_epoch": state["epoch"], "step": state["step"], **res}
    run_dir = path if path.is_dir() else path.parent
    (run_dir / "eval.json").write_text(json.dumps(out, indent=2) + "\n")
    print("| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v:.4g} |" if
          isinstance(v, float) else f"| {k} | {v} |" for k, v in out.items()))
    return out


def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except BnlabError as e:
        print(f"bnlab: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
