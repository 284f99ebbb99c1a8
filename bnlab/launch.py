"""From a composed Hydra config to finished ranks: check, then train in 1 or N processes.

- `python train.py ...`: one process, or `dist.nproc_per_node=N` local ranks started here
  through torch's elastic launcher (so every job of a Hydra multirun can be N-rank DDP).
- `torchrun --nproc_per_node=N train.py ...`: each rank arrives here and trains directly.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import NoReturn

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from bnlab import dist, doctor, precheck, resume, trainer
from bnlab.cli import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_FAILED, EXIT_PREEMPTED
from bnlab.config import check_data, validate
from bnlab.errors import BnlabError
from bnlab.metrics import summary
from bnlab.net import build_net
from bnlab.rundir import FINAL, read_status, read_status_full, set_status


def fail(msg: str, run_dir: Path | None = None, root: Path | None = None) -> None:
    """Print one sentence (rank 0), drop the empty run directory Hydra made, exit 2."""
    dist.print0(f"bnlab: error: {msg}", file=sys.stderr)
    if run_dir is not None and dist.is_local_main():
        stop = root.resolve() if root is not None else run_dir.parent.resolve()
        d = run_dir.resolve()
        while d != stop and stop in d.parents and d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent
    raise SystemExit(EXIT_BAD_INPUT)


def preflight(cfg: dict, run_dir: Path) -> tuple[dict[str, int], bool]:
    """Everything that can be checked before a process group or file exists.

    Returns the values per channel that each BN layer normalizes over on one rank, and
    whether this launch resumes the unfinished run in `run_dir`.
    """
    validate(cfg)
    resuming = resume.plan(run_dir, cfg)
    check_writable(run_dir)
    check_data(cfg)
    model = build_net(cfg)  # also checks GroupNorm groups against every layer
    side = cfg["data"]["image_size"]
    # The doctor's rule, on the model as built (its BN kinds and sync groups): one rule for the
    # doctor and this warning (python -m bnlab doctor gives the same verdict and fixes).
    world, batch = dist.world_size(cfg), cfg["batch_per_gpu"]
    least = cfg["diagnostics"]["min_values"]
    layers = doctor.measure(model, (3, side, side), world, batch, None, 0, least,
                            doctor.MIN_IMAGES)
    counts = {layer.name: layer.normalized_over for layer in layers if layer.batch_dependent}
    if any(layer.at_risk for layer in layers):  # two lines: the risk, then where the fixes are
        dist.print0(f"bnlab: warning: {doctor.risk_line(layers, least, doctor.MIN_IMAGES)}\n"
                    f"  the fixes, with their evidence: bnlab doctor --model "
                    f"bnlab:{cfg['model']['name']} --input 3x{side}x{side} --world {world} "
                    f"--batch-per-rank {batch}"
                    + (f" --min-values {least}" if least != doctor.MIN_VALUES else ""),
                    file=sys.stderr)
    worst = min(counts, key=counts.get, default=None)
    if worst is not None and counts[worst] <= 1:
        raise BnlabError(
            f"batch_per_gpu={cfg['batch_per_gpu']} leaves BN layer '{worst}' with "
            f"{counts[worst]} value per channel per rank, which BN cannot normalize; use "
            "norm=syncbn with more ranks, norm=gn, or a larger batch_per_gpu."
        )
    return counts, resuming


def check_writable(run_dir: Path) -> None:
    """The run directory (Hydra has made it) must take files: `-m` runs skip the precheck."""
    if not precheck.writable(run_dir):
        raise BnlabError(f"cannot write to the run directory {run_dir}; choose a writable "
                         "output_dir or hydra.run.dir.")


def worker(cfg: dict, run_dir: str, meta: dict, resuming: bool = False) -> dict:
    """One rank: join the group, train, leave. Bad input found here is returned, not raised;
    any other failure marks the run failed (a checkpoint, if any, lets it resume)."""
    d = cfg["dist"]
    try:
        env = dist.init(d["device"], d["backend"], d["timeout_s"], d["threads"])
    except BnlabError as e:  # the process group could not be formed: nothing has started
        return {"ok": False, "error": str(e)}
    try:
        result = {"ok": True, **trainer.run(cfg, Path(run_dir), env, meta, resuming)}
    except BnlabError as e:  # raised identically on every rank, before any collective
        result = {"ok": False, "error": str(e)}
    except BaseException as e:
        mark_failed(Path(run_dir), f"rank {env.rank}: {type(e).__name__}: {e}")
        dist.teardown(wait_for_others=False)  # the other ranks may never get here
        raise
    dist.teardown()
    return result


def mark_failed(run_dir: Path, error: str) -> None:
    """Any rank that fails marks a running run failed (rank 0 may be the one that died)."""
    if read_status(run_dir) == "running":
        set_status(run_dir, "failed", error=error.splitlines()[0][:300] if error else "")


def preempted(run_dir: Path, step: int | None) -> NoReturn:
    dist.print0(f"bnlab: preempted: checkpointed at step {step}; relaunch the same command "
                f"(same hydra.run.dir) to resume {run_dir}.", file=sys.stderr)
    raise SystemExit(EXIT_PREEMPTED)


def stopped_by_signal(run_dir: Path, sig: int) -> NoReturn:
    """A stop that torch's launcher of local ranks heard, passed to its ranks and raised."""
    rec = read_status_full(run_dir) or {}
    status, name = rec.get("status"), signal.Signals(sig).name
    if status is None:  # no rank began the run: die by the signal, as a run stopped while it
        signal.signal(sig, signal.SIG_DFL)  # starts does (a sweep counts it not started)
        signal.raise_signal(sig)
        raise SystemExit(128 + sig)
    if status == "preempted":
        preempted(run_dir, rec.get("step"))
    if status in FINAL:  # the launcher's exit barrier: the ranks had ended the run
        print(f"bnlab: {name} came after the run had ended ({status}): {run_dir}.",
              file=sys.stderr)
        raise SystemExit(EXIT_DIVERGED if status == "diverged" else 0)
    mark_failed(run_dir, f"stopped by {name} before its ranks could checkpoint")
    print(f"bnlab: error: stopped by {name} before the ranks checkpointed; relaunch the "
          f"same command to resume {run_dir} from its last checkpoint.", file=sys.stderr)
    raise SystemExit(EXIT_FAILED)


def main(cfg: DictConfig) -> dict:
    slurm = dist.adopt_slurm_env()  # SLURM tasks become ranks, as under torchrun
    c = OmegaConf.to_container(cfg, resolve=True)
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    try:
        if (dist.under_torchrun() or slurm) and c["dist"]["simulate"] > 1:
            raise BnlabError("dist.simulate cannot be combined with torchrun or SLURM tasks; "
                             "simulate W ranks in one process (python train.py "
                             "dist.simulate=W).")
        if dist.under_torchrun() and hc.mode == RunMode.MULTIRUN:
            raise BnlabError("a Hydra multirun (-m) cannot run under torchrun; launch it with "
                             "python and set dist.nproc_per_node=N to give each job N ranks.")
        counts, resuming = preflight(c, run_dir)
    except BnlabError as e:
        fail(str(e), run_dir, Path(c["output_dir"]))
    nproc = c["dist"]["nproc_per_node"]
    launcher = "torchrun" if dist.under_torchrun() else "slurm" if slurm else \
        "local" if nproc > 1 else "single"
    meta = {"launcher": launcher, "overrides": list(hc.overrides.task),
            "bn_values_per_channel": counts}
    if launcher == "local":
        try:
            result = dist.launch_local(worker, nproc, c, str(run_dir), meta, resuming)[0]
        except ChildFailedError as e:
            mark_failed(run_dir, "a rank process failed")
            first = next(iter(e.failures.values()), None)
            how = f"exit code {first.exitcode}" if first is not None else "failed"
            dist.print0(f"bnlab: error: a rank process failed ({how}) and the others were "
                        f"stopped; the run in {run_dir} is marked failed; relaunch the same "
                        "command to resume it from its last checkpoint.", file=sys.stderr)
            raise SystemExit(EXIT_FAILED) from None
        except SignalException as e:  # torch's launcher heard the stop; its ranks did too
            stopped_by_signal(run_dir, e.sigval)
    else:
        result = worker(c, str(run_dir), meta, resuming)
    if not result["ok"]:
        fail(result["error"], run_dir if not resuming else None, Path(c["output_dir"]))
    dist.print0(summary(run_dir, result))
    stopped = result.get("stopped")
    if stopped == "diverged":
        dist.print0(f"bnlab: training diverged (non-finite loss) at step {result['step']}; the "
                    f"run is marked diverged in {run_dir / 'status.json'}.", file=sys.stderr)
        if hc.mode != RunMode.MULTIRUN:  # in a multirun the other jobs go on
            raise SystemExit(EXIT_DIVERGED)
    if stopped == "preempted":
        preempted(run_dir, result["step"])
    return result
