"""Multi-process checks on gloo: metric reduction and gradient accumulation under DDP."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from bnlab import dist, hydra_setup
from bnlab.errors import BnlabError
from bnlab.metrics import Meter
from bnlab.models import build_model
from bnlab.norms import convert
from bnlab.trainer import train_step
from conftest import ROOT


def _fake_step(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A deterministic (loss, logits, labels) triple; batch size varies by rank and step."""
    g = torch.Generator().manual_seed(100 * rank + step)
    n = 2 + (rank + step) % 3
    return torch.rand((), generator=g) * 3, torch.randn(n, 10, generator=g), \
        torch.randint(0, 10, (n,), generator=g)


def _meter_worker(steps: int) -> dict:
    env = dist.init("cpu", "gloo")
    m = Meter(env.device)
    for s in range(steps):
        m.add(*_fake_step(env.rank, s))
    out = m.reduce("train")
    dist.teardown()
    return out


@pytest.mark.slow  # CI time (14 s); make test-slow runs it
def test_logged_loss_is_the_mean_over_every_step_and_rank():
    world, steps = 2, 7
    results = dist.launch_local(_meter_worker, world, steps)
    loss_sum = correct = count = 0.0
    for r in range(world):
        for s in range(steps):
            loss, logits, y = _fake_step(r, s)
            loss_sum += float(loss) * len(y)
            correct += float((logits.argmax(1) == y).sum())
            count += len(y)
    for res in results:  # every rank gets the same reduced value
        assert abs(res["train/loss"] - loss_sum / count) < 1e-9
        assert abs(res["train/acc"] - 100 * correct / count) < 1e-9


def _batch(n: int = 16):
    g = torch.Generator().manual_seed(7)
    return torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def _model(norm: str) -> torch.nn.Module:
    torch.manual_seed(0)
    opts = {"groups": 8, "cap_groups": True} if norm == "gn" else {}
    model = convert(build_model("resnet20"), norm, **opts)
    if norm == "bn":  # warm the running statistics, then use them (eval mode): batch-independent
        with torch.no_grad():
            model(_batch(64)[0] * 0.5 + 0.1)
        model.eval()
    return model


def _accum_worker(norm: str, b: int, k: int) -> dict:
    env = dist.init("cpu", "gloo")
    model = _model(norm)
    net = DDP(model)
    x, y = _batch()
    w = env.world * b
    micro = [(x[m * w + env.rank * b: m * w + (env.rank + 1) * b],
              y[m * w + env.rank * b: m * w + (env.rank + 1) * b]) for m in range(k)]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    train_step(net, micro, opt, Meter(env.device), sync_grads=True)
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters()}
    del net
    dist.teardown()
    return grads


@pytest.mark.slow  # CI time (31 s); make test-slow runs it
def test_grad_accum_equals_one_big_batch():
    """2 ranks x 4 images x grad_accum 2 gives the gradient of one batch of 16."""
    for norm in ("gn", "bn"):
        ref_model = _model(norm)
        x, y = _batch()
        F.cross_entropy(ref_model(x), y).backward()
        for grads in dist.launch_local(_accum_worker, 2, norm, 4, 2):
            for n, p in ref_model.named_parameters():
                torch.testing.assert_close(torch.from_numpy(grads[n]), p.grad, rtol=1e-5,
                                           atol=1e-6, msg=n)


def test_slurm_tasks_become_ranks_and_share_one_run_directory(monkeypatch):
    env = {"SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2",
           "SLURM_LOCALID": "2", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_JOB_ID": "12345", "SLURM_STEP_ID": "0"}
    assert dist.adopt_slurm_env(env) is True
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == \
        ("2", "4", "2", "4")
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == str(20000 + 12345)
    # Two nodes, the step started by srun on a login node (10.0.0.7): rank 0 is on gpu003.
    two_nodes = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                 "SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_ID": "5",
                 "SLURM_STEP_NODELIST": "gpu[003-004]", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.7"}
    assert dist.adopt_slurm_env(two_nodes) is True
    assert (two_nodes["RANK"], two_nodes["LOCAL_WORLD_SIZE"], two_nodes["MASTER_ADDR"]) == \
        ("3", "2", "gpu003")
    for nodelist, first in [("n1", "n1"), ("n1,n2", "n1"), ("gpu[003-008,012],cpu1", "gpu003"),
                            ("rack[1-2]-node[07-09]", "rack1-node07"), ("a[5,2]", "a5")]:
        assert dist.first_host(nodelist) == first, nodelist
    assert dist.adopt_slurm_env({"SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is False
    # The batch script of a job with 4 tasks (what SLURM 22.05 gives it: no step variables) is
    # one process, not rank 0 of 4 that would wait for 3 ranks that never come.
    batch = {"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_ID": "6"}
    assert dist.adopt_slurm_env(batch) is False and "RANK" not in batch
    torchrun = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2", "RANK": "0"}
    assert dist.adopt_slurm_env(torchrun) is False and torchrun["RANK"] == "0"
    # Every task of a step, and the job again after a requeue, get the same directory; the
    # batch script (no step) names the job alone.
    for k in ("BNLAB_RUN_STAMP", "SLURM_STEP_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setattr(hydra_setup, "_stamp", None)
    assert hydra_setup.run_stamp() == "slurm-777"
    # Two srun steps one after the other in one job are two runs: a directory each.
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    monkeypatch.setattr(hydra_setup, "_stamp", None)
    assert hydra_setup.run_stamp() == "slurm-777.1"
    # A job array's tasks are different runs: each its own stamp (the array's id is shared).
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "770")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setattr(hydra_setup, "_stamp", None)
    assert hydra_setup.run_stamp() == "slurm-770_3.1"
    monkeypatch.setattr(hydra_setup, "_stamp", None)


def master_store():
    """The store torchrun's agents share, as the master holds it, on a free local port."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))


@pytest.fixture
def agents_store(monkeypatch):
    """This process's environment as a rank's under torchrun with an agents' store."""
    store = master_store()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    return store


def test_rank_0_leaves_its_stamp_in_the_agents_store_and_another_rank_takes_it(monkeypatch,
                                                                                agents_store):
    """The store's path in one process: rank 0 leaves its own stamp, a later rank (with a
    stamp of its own) reads rank 0's."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "r1")
    monkeypatch.setenv("RANK", "0")
    assert hydra_setup._rendezvous_stamp("rank0-start") == "rank0-start"
    monkeypatch.setenv("RANK", "1")
    assert hydra_setup._rendezvous_stamp("rank1-start") == "rank0-start"


@pytest.mark.slow  # two agents' interpreters; the store's path: the test above
def test_torchrun_ranks_take_rank_0s_stamp_from_the_rendezvous_store():
    """Ranks of one run under agents that started at different times (here: rank 1 under a
    shell started 1.2 s later) agree on rank 0's stamp, read from the agents' store."""
    store = master_store()
    code = "from bnlab.hydra_setup import run_stamp; print(run_stamp())"
    base = {k: v for k, v in os.environ.items() if k != "BNLAB_RUN_STAMP"}
    base.update(TORCHELASTIC_RUN_ID="none", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    procs = []
    for use_store in ("True", "False"):  # with the store, and (what it fixes) without
        for rank in ("1", "0"):  # rank 1 first: it waits for rank 0
            cmd = ["bash", "-c", f"{sys.executable} -c '{code}'; true"]  # bash: a new parent
            env = {**base, "RANK": rank, "TORCHELASTIC_USE_AGENT_STORE": use_store}
            procs.append(subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE))
            time.sleep(1.2)
    stamps = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert stamps[0] == stamps[1] and stamps[0]
    assert stamps[2] != stamps[3]  # each its own agent's start, seconds apart


def test_a_rank_that_cannot_reach_the_store_says_so_in_one_sentence(monkeypatch, agents_store):
    monkeypatch.setattr(hydra_setup, "STORE_TIMEOUT_S", 1)
    monkeypatch.setenv("RANK", "1")  # rank 0 never leaves its stamp
    with pytest.raises(BnlabError, match="could not agree on the run directory") as e:
        hydra_setup._rendezvous_stamp("own")
    assert "\n" not in str(e.value) and "BNLAB_RUN_STAMP" in str(e.value)


def test_agents_on_several_nodes_without_a_shared_store_are_refused(monkeypatch):
    """torch before 2.5 gives c10d rendezvous workers no agent store: one agent falls back to
    its own start time, several (nodes) would each name a directory, so that is one sentence
    naming the fix."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    assert hydra_setup._rendezvous_stamp("own") is None
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    with pytest.raises(BnlabError, match="2 torchrun agents") as e:
        hydra_setup._rendezvous_stamp("own")
    assert "\n" not in str(e.value) and "BNLAB_RUN_STAMP" in str(e.value)


# -- C11: every process started as rank 0 ------------------------------------------------------

def test_join_error_names_the_port_in_use_and_the_fix():
    e = RuntimeError("The server socket has failed to listen on any local network address. "
                     "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE")
    msg = dist.join_error(e, 0, 2, 30)
    assert "the port is in use" in msg and "own RANK" in msg and "\n" not in msg


@pytest.mark.slow  # CI time (19 s); the sentence is unit-tested above
def test_two_processes_both_started_as_rank_0_get_one_sentence_each(tmp_path):
    """The C11 pitfall: RANK=0 in every process. Each exits with status 2 and one sentence
    (which one depends on who binds MASTER_PORT first), no traceback."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29593"}
    cmd = [sys.executable, str(ROOT / "train.py"), "data=synthetic", "data.num_train=64",
           "data.num_val=32", "model=resnet20", "batch_per_gpu=4", "epochs=1", "norm=syncbn",
           "dist.timeout_s=5", "progress=false"]
    procs = [subprocess.Popen([*cmd, f"hydra.run.dir={tmp_path / str(i)}"], cwd=tmp_path,
                              env=env, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        err = p.communicate(timeout=120)[1]
        lines = [x for x in err.splitlines() if x.startswith("bnlab: error:")]
        assert p.returncode == 2, err[-1500:]
        assert "Traceback" not in err and len(lines) == 1
        assert "own RANK" in lines[0]
    assert not any((tmp_path / str(i) / "status.json").exists() for i in range(2))
