"""Device-side meters and the one metrics path: JSONL + console + wandb, written by rank 0.

Meters add up on the device every step and are reduced across ranks only at log time, so a
logged loss is the mean over every step and every rank, not a sparse sample.
"""

from __future__ import annotations

import base64
import json
import math
import netrc
import os
import zlib
from pathlib import Path

import numpy as np
import torch

from bnlab import dist


class Meter:
    """Sums of loss and correct predictions over samples, kept on the device (no host sync)."""

    def __init__(self, device: torch.device):
        self.t = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        n = y.numel()
        self.t[0] += loss.detach().double() * n
        self.t[1] += (logits.detach().argmax(1) == y).sum()
        self.t[2] += n

    def reduce(self, prefix: str) -> dict[str, float]:
        """Mean loss and accuracy (%) over every sample on every rank since the last reset."""
        t = dist.all_reduce_sum(self.t.clone())
        loss, correct, n = t.tolist()  # host sync: log time only
        self.t.zero_()
        if n == 0:
            return {}
        return {f"{prefix}/loss": loss / n, f"{prefix}/acc": 100.0 * correct / n}


def wandb_mode(requested: str) -> str:
    """`auto` means online only when an API key is configured; otherwise offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        rc = netrc.netrc()
        if rc.authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


class MetricsLogger:
    """Writes flat dicts with namespaced keys; a no-op on ranks other than 0."""

    def __init__(self, run_dir: Path, enabled: bool, cfg: dict | None = None,
                 console: bool = True, wandb_cfg: dict | None = None):
        self.enabled = enabled
        self.console = console
        self.run = None
        if not enabled:
            return
        self.path = Path(run_dir) / METRICS
        self.file = open(self.path, "a", buffering=1)  # noqa: SIM115 (closed in close())
        if wandb_cfg and wandb_cfg.get("enabled"):
            import wandb

            mode = wandb_mode(wandb_cfg.get("mode", "auto"))
            self.run = wandb.init(
                project=wandb_cfg.get("project", "bnlab"), group=wandb_cfg.get("group"),
                name=Path(run_dir).name, dir=str(run_dir), config=cfg, mode=mode,
                settings=wandb.Settings(init_timeout=60, silent=True),
            )

    def log(self, record: dict, echo: bool = True) -> None:
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in record.items()}
        self.file.write(json.dumps(clean) + "\n")
        if self.run is not None:
            self.run.log(record, step=record.get("step"))
        if self.console and echo:
            print(" ".join(_fmt(k, v) for k, v in record.items()), flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self.file.close()
        if self.run is not None:
            self.run.finish()


def _fmt(k: str, v) -> str:
    return f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a metrics file (a truncated last line is skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


# ----------------------------------------------------------------------------------------
# Per-example predictions: one line per evaluation, a separate file beside metrics.jsonl

PREDICTIONS = "predictions.jsonl"
METRICS = "metrics.jsonl"


def encode_classes(classes: torch.Tensor | np.ndarray, level: int = 9) -> str:
    """Class indices (0..255) as compressed bytes in base64: ~0.5 KB for 1,017 images.
    `level`: zlib's (decode_classes reads any); on a random mask of 1,000 images, 1 took a
    sixth of 9's time for about a quarter more bytes."""
    a = np.asarray(classes.cpu() if isinstance(classes, torch.Tensor) else classes)
    return base64.b64encode(zlib.compress(a.astype(np.uint8).tobytes(), level)).decode("ascii")


def decode_classes(text: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=np.uint8)


class PredictionLog:
    """predictions.jsonl: the test labels once (step 0), then for every evaluation and every
    way of evaluating it (`kind`: ema, precise, batch) each test image's predicted class, in
    test-set order. Written by rank 0; cut back to the checkpoint's step on resume like
    metrics.jsonl."""

    def __init__(self, run_dir: Path, enabled: bool, labels: torch.Tensor | None = None):
        self.enabled = enabled
        if not enabled:
            return
        path = Path(run_dir) / PREDICTIONS
        has_labels = path.is_file() and any("labels" in r for r in read_jsonl(path))
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 (closed in close())
        if not has_labels and labels is not None:
            self.file.write(json.dumps({"step": 0, "labels": encode_classes(labels)}) + "\n")

    def log(self, step: int, epoch: float, kind: str, classes: torch.Tensor) -> None:
        if self.enabled:
            self.file.write(json.dumps({"step": step, "epoch": epoch, "kind": kind,
                                        "pred": encode_classes(classes)}) + "\n")

    def close(self) -> None:
        if self.enabled:
            self.file.close()


def read_predictions(path: Path) -> tuple[np.ndarray, dict[str, tuple[list[float], np.ndarray]]]:
    """predictions.jsonl back: the labels, and for each kind the evaluations' epochs and an
    (evaluations, images) array of predicted classes."""
    labels, by_kind = None, {}
    for rec in read_jsonl(path):
        if "labels" in rec:
            labels = decode_classes(rec["labels"])
        elif "pred" in rec:
            epochs, rows = by_kind.setdefault(rec["kind"], ([], []))
            epochs.append(rec["epoch"])
            rows.append(decode_classes(rec["pred"]))
    if labels is None:
        raise ValueError(f"{path} holds no labels line")
    return labels, {k: (e, np.stack(r)) for k, (e, r) in by_kind.items()}


def summary(run_dir: Path, result: dict) -> str:
    """The run on one screen: how it ended, the last val acc, its jitter beside the test
    set's floor, the training time, and where its files are (read back from metrics.jsonl)."""
    from bnlab import jitter

    rows = [r for r in read_jsonl(Path(run_dir) / METRICS) if "val/acc" in r]
    n_val = result.get("val_images")
    accs = [r["val/acc"] for r in rows]
    sched = result.get("schedule")
    cut = f", max_steps: the schedule spans {sched}" if sched and result.get("steps") != sched \
        else ""
    lines = [f"bnlab: {result.get('stopped', 'done')} at step {result.get('step')} of "
             f"{result.get('steps', '?')}{cut}"
             + (f" (epoch {rows[-1]['epoch']:.2f})" if rows else "")]
    if rows:
        acc, loss = accs[-1], rows[-1].get("val/loss")  # None: logged as not finite
        lines.append(f"  val acc {'not finite' if acc is None else f'{acc:.2f}%'} (loss "
                     f"{'not finite' if loss is None else f'{loss:.3f}'}) after {len(accs)} "
                     "evaluation(s)")
        tail = accs[-jitter.MIN_EVALS * 2:]
        if len(tail) >= jitter.MIN_EVALS and n_val and None not in tail:
            lines.append(f"  jitter over the last {len(tail)} evaluations: "
                         f"{jitter.von_neumann_sd(tail):.2f} points (von Neumann sd), beside "
                         f"{jitter.binomial_floor(accs[-1], n_val):.2f} from the {n_val} "
                         "validation images alone")
    if result.get("train_s") is not None:
        lines.append(f"  training time of this launch {result['train_s']:.1f} s (evaluation "
                     "excluded)")
    files = [f.name for f in sorted(Path(run_dir).iterdir()) if f.is_file()]
    lines.append(f"  run directory {run_dir}: {', '.join(files)}")
    if "checkpoint.pt" in files:
        lines.append(f"  evaluate it: python evaluate.py run={run_dir}")
    return "\n".join(lines)


def essentials(cfg: dict, n_train: int, n_val: int, size: int, env, per_step: int) -> str:
    # env: the run's DistEnv (its world and device)
    """The run in one line, at its start: what trains on what, at which rate, for how long."""
    from bnlab import optim

    sim, o, d = cfg["dist"]["simulate"], cfg["optim"], cfg["data"]
    w = dist.world_size(cfg, env.world)
    ranks = f"{w} ranks" + (" (simulated)" if sim > 1 else "") if w > 1 else "1 rank"
    accum = f" x {cfg['grad_accum']} accumulated" if cfg["grad_accum"] > 1 else ""
    warm = f", {o['warmup_epochs']:g} warmup epochs" if o["warmup_epochs"] else ""
    base = o.get("scale_from", 0)
    rate = f"{optim.peak_lr(o, per_step):g}" + \
        (f" (= {o['lr']:g} x {per_step} / {base})" if base else "")
    held = f"{d.get('holdout', 0)} held-out training images" if d.get("holdout") else "test"
    px = f" at {size} px" if size != 32 else ""
    return (f"bnlab: {cfg['model']['name']}, {cfg['norm']['kind']}, {ranks} x "
            f"{cfg['batch_per_gpu']} images{accum}; {o.get('name', 'sgd')} lr {rate} "
            f"({o['schedule']}{warm}), {cfg['epochs']} epochs; {d['name']}: "
            f"{n_train} training images{px}, validation on {n_val} ({held}); "
            f"{env.device}")
