"""Hydra resolvers, registered before the config is composed.

`${run_stamp:}` replaces `${now:}` in run-directory names. Under torchrun every rank composes
its own config, and `${now:}` resolves per process, so ranks that start a second apart would
create one directory each, and so would the agents of a multi-node run. The stamp is instead
the run's own: the SLURM job step's, else the one rank 0 leaves in the rendezvous store that
every torchrun agent of the run shares (the start time of rank 0's agent), else the start
time of the local agent.
"""

from __future__ import annotations

import os
import time

from omegaconf import OmegaConf

from bnlab.errors import BnlabError

FORMAT = "%Y-%m-%d_%H-%M-%S"
_stamp: str | None = None
STORE_TIMEOUT_S = 300  # how long a rank waits for rank 0's stamp


def _parent_start_time() -> float | None:
    """Start time (epoch seconds) of this process's parent, from /proc (Linux)."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: starttime, in clock ticks after boot
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _rendezvous_stamp(own: str) -> str | None:
    """Rank 0's stamp, through the store torchrun's agents share for this run: rank 0 leaves
    `own` (its agent's start time) and every other rank, on any node, waits for it. None
    where torchrun gives its workers no such store and runs one agent; one sentence where
    several agents (nodes) would each name a directory of their own."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_PORT" not in env:
        agents = env.get("GROUP_WORLD_SIZE", "1")
        if agents.isdigit() and int(agents) > 1:  # each agent would name its own directory
            raise BnlabError(
                f"this run has {agents} torchrun agents (nodes) and its rendezvous gives them "
                "no shared store to agree on one run directory (c10d before torch 2.5, etcd, "
                "or TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1); set BNLAB_RUN_STAMP to one value "
                "on every node, or hydra.run.dir.")
        return None
    from datetime import timedelta

    from torch.distributed import TCPStore

    key = "bnlab/run_stamp/{}/{}".format(env.get("TORCHELASTIC_RUN_ID", ""),
                                          env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        store = TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]),
                         is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))
        if env.get("RANK") == "0":
            store.set(key, own)
            return own
        return store.get(key).decode()
    except (RuntimeError, TimeoutError) as e:  # DistStoreError is a RuntimeError
        raise BnlabError(
            f"rank {env.get('RANK')} could not agree on the run directory with rank 0 through "
            f"torchrun's store at {env.get('MASTER_ADDR')}:{env['MASTER_PORT']} within "
            f"{STORE_TIMEOUT_S} s ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "check that every agent can reach it, or set BNLAB_RUN_STAMP on every node.") from e


def slurm_stamp(env) -> str:
    """`slurm-<job>` (an array's task: `slurm-<array>_<task>`), and `.<step>` in an srun step,
    as SLURM names steps: every task of a step agrees, a requeued job's steps are numbered
    again from 0 (so it finds its runs and resumes them), and two runs one after the other in
    one job (two srun steps) get a directory each."""
    job = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
           if "SLURM_ARRAY_TASK_ID" in env else env["SLURM_JOB_ID"])
    step = env.get("SLURM_STEP_ID")
    return f"slurm-{job}" + (f".{step}" if step not in (None, "") else "")


def run_stamp() -> str:
    """One stamp per run: $BNLAB_RUN_STAMP, else the SLURM job step (all its tasks, and the
    job again after a requeue), else rank 0's under torchrun (every agent, on any node), else
    the local agent's start, else now."""
    global _stamp
    if _stamp is None:
        _stamp = os.environ.get("BNLAB_RUN_STAMP")
    if _stamp is None and "SLURM_JOB_ID" in os.environ:
        _stamp = slurm_stamp(os.environ)
    if _stamp is None:
        t = _parent_start_time() if "TORCHELASTIC_RUN_ID" in os.environ else None
        own = time.strftime(FORMAT, time.localtime(t if t is not None else time.time()))
        shared = _rendezvous_stamp(own) if "TORCHELASTIC_RUN_ID" in os.environ else None
        _stamp = shared or own
    return _stamp


def register() -> None:
    if not OmegaConf.has_resolver("run_stamp"):
        # use_cache: a config pickled to another process (Hydra's submitit launcher sends
        # its jobs the one it resolved when it submitted them) keeps the stamp it resolved to.
        OmegaConf.register_new_resolver("run_stamp", run_stamp, use_cache=True)
