"""All distributed plumbing: rank, world, device, reductions, local launch, teardown.

The trainer never asks how it was launched. It gets a `DistEnv` and calls the helpers
below, which are no-ops for a single process.
"""

from __future__ import annotations

import datetime
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as tdist

from bnlab.errors import BnlabError


def world_size(cfg: dict, processes: int | None = None) -> int:
    """Ranks of the run, the one definition: its processes (`processes` where the caller knows
    them, else torchrun's WORLD_SIZE, else dist.nproc_per_node) times the ranks each simulates."""
    d = cfg["dist"]
    if processes is None:
        processes = int(os.environ.get("WORLD_SIZE", d["nproc_per_node"]))
    return processes * d["simulate"]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str | None  # None when world == 1 (no process group)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def adopt_slurm_env(env: dict | None = None) -> bool:
    """In a SLURM job step of several tasks (`srun`, as submitit and Hydra's submitit launcher
    start them), give each task torchrun's variables: RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE and a rendezvous address. Returns True if it did.

    Only a step's tasks are ranks (srun sets SLURM_STEP_NUM_TASKS): a batch script of a job
    with several tasks also sees SLURM_NTASKS and SLURM_PROCID=0, and a `python train.py` there
    is one process, not rank 0 of tasks that will never come. Nothing changes when torchrun's
    RANK is already set or the step has one task.
    """
    env = os.environ if env is None else env
    ntasks = int(env.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if "RANK" in env or ntasks < 2 or "SLURM_PROCID" not in env:
        return False
    nodes = int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "1")) or 1)
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = str(ntasks)
    env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    env["LOCAL_WORLD_SIZE"] = str(ntasks // nodes)
    # Rank 0 runs on the step's first node (not where srun ran: a login node, for one)
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
    env.setdefault("MASTER_ADDR", first_host(nodelist) if nodes > 1 and nodelist else
                   "127.0.0.1")
    env.setdefault("MASTER_PORT", str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000))
    return True


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: `gpu[003-008,012],cpu1` -> `gpu003`."""
    head, depth = "", 0
    for ch in nodelist:  # the first entry: up to the first comma outside brackets
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            break
        head += ch
    if "[" not in head:
        return head
    prefix, rest = head.split("[", 1)
    ranges, suffix = rest.split("]", 1)
    return prefix + ranges.split(",")[0].split("-")[0] + first_host(suffix)


def under_torchrun() -> bool:
    """True when this process is a worker started by torchrun or torch's elastic launcher."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def pick_device(device: str, local_rank: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
    return torch.device(device)


def init(device: str = "auto", backend: str = "auto", timeout_s: float = 300,
         threads: int = 0) -> DistEnv:
    """Read rank/world from the environment (torchrun sets it) and create the process group."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dev = pick_device(device, local_rank)
    # Ranks on one CPU machine share its cores: give each an equal share, not all of them.
    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // local_world))
    if world == 1:
        return DistEnv(0, 1, 0, dev, None)
    if backend == "auto":
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    try:
        tdist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if backend == "nccl" else None,
        )
    except tdist.DistError as e:
        raise BnlabError(join_error(e, rank, world, timeout_s)) from None
    return DistEnv(rank, world, local_rank, dev, backend)


def join_error(e: Exception, rank: int, world: int, timeout_s: float) -> str:
    """One sentence for a process group that could not be formed (claim C11's second
    pitfall, every process started as rank 0, ends here)."""
    where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "EADDRINUSE" in first or "address already in use" in first:
        return (f"rank {rank} could not listen on {where}: the port is in use, by another job "
                "or by a second process that was also started as RANK=0; choose a free "
                "MASTER_PORT, and give each process its own RANK (torchrun does).")
    if "Timed out" in first or "timed out" in first:
        return (f"the {world} processes did not all join the process group at {where} within "
                f"dist.timeout_s={timeout_s:g} s ({first}); start each process with its own "
                f"RANK from 0 to {world - 1} (torchrun does) and the same MASTER_ADDR, "
                "MASTER_PORT and WORLD_SIZE.")
    return (f"rank {rank} could not join the process group at {where} ({first}); check "
            "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun sets them).")


def teardown(wait_for_others: bool = True) -> None:
    """Leave the process group once every rank is done.

    gloo's worker threads release finished work objects under the GIL. Destroying the group
    (which joins those threads) while one still waits for the GIL deadlocks (seen with torch
    2.13 when a DDP reducer dropped the last reference). So: barrier, then let the threads
    drain with the GIL released, then destroy.
    """
    if tdist.is_available() and tdist.is_initialized():
        if wait_for_others and tdist.get_world_size() > 1:
            tdist.barrier()
        time.sleep(0.2)  # releases the GIL: the worker threads finish their clean-up
        tdist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks in place (no-op for one process) and return it."""
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Max of a tensor over ranks in place (no-op for one process) and return it."""
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t


def barrier() -> None:
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.barrier()


def broadcast_buffers(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank `src`'s buffers to every rank, as DDP's buffer sync does at each forward."""
    if tdist.is_initialized() and tdist.get_world_size() > 1:
        for b in module.buffers():
            tdist.broadcast(b, src)


def all_gather_object(obj) -> list:
    """Every rank's `obj`, in rank order (a list of one without a process group)."""
    if not (tdist.is_initialized() and tdist.get_world_size() > 1):
        return [obj]
    out: list = [None] * tdist.get_world_size()
    tdist.all_gather_object(out, obj)
    return out


def is_local_main() -> bool:
    return int(os.environ.get("LOCAL_RANK", 0)) == 0


def print0(*args, **kwargs) -> None:
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs, flush=True)


# ----------------------------------------------------------------------------------------
# Local launch: one Hydra job starting its own N ranks (the machinery behind torchrun)


# How local ranks start: "spawn", a fresh interpreter each, as a CUDA process must (a forked
# child cannot use the CUDA context its parent made). The tests start theirs from a fork
# server (tests/conftest.py), which never touches CUDA: a spawned rank imports torch and bnlab
# again, about ten times the cost of the gloo work most of them check.
START_METHOD = "spawn"


def launch_local(fn: Callable, nproc: int, *args) -> list:
    """Run `fn(*args)` on `nproc` local ranks through torch's elastic launcher; return results.

    Return values travel by pickling: keep them plain Python or numpy, never torch tensors
    (tensors go through shared memory that the finished worker must keep alive).
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the signals the launcher passes on to its ranks, which checkpoint (bnlab.preempt);
    # torch's default leaves out SIGUSR1 and SIGUSR2, which killed it with its ranks running
    handled = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
    if "signals_to_handle" in LaunchConfig.__dataclass_fields__:
        extra = {"signals_to_handle": handled}
    else:  # older torch reads only the environment
        extra = {}
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = handled
    config = LaunchConfig(
        **extra,
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"bnlab-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.5,
        start_method=START_METHOD,
    )
    results = elastic_launch(config, fn)(*args)
    return [results[r] for r in sorted(results)]
