"""`make table-pitfalls` (claim C11): SyncBN set up the wrong way, what torch does on its own
and what bnlab does, each measured here.

    python -m bnlab.claims pitfalls            # measure (about 2 min), then the table
    python -m bnlab.claims pitfalls --report   # table from results.json only

Writes `results.json` (every observation) and `table.md` (generated from it). The cases run
real 2-process gloo groups on generated images: they show mechanisms (an error, parameters
that drift apart across ranks, a refusal), not accuracy.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from bnlab.lab.page import results_kernels
from bnlab.lab.table import Context, Table, Verdict
from bnlab.paths import ROOT

STEPS = 5


def _first(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


# -- 1: SyncBN conversion after DDP wrapping --------------------------------------------------

def _convert_worker(mode: str) -> dict:
    """Train STEPS steps of resnet20 on 2 gloo ranks with SyncBN converted before DDP wraps
    the model, or after (DDP built over the old BN layers)."""
    import warnings

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bnlab import dist
    from bnlab.errors import BnlabError
    from bnlab.models import build_model
    from bnlab.norms import convert

    warnings.filterwarnings("ignore")
    env = dist.init("cpu", "gloo", timeout_s=60)
    torch.manual_seed(0)
    model = build_model("resnet20")
    out: dict = {"mode": mode}
    if mode == "bnlab":  # bnlab's API on the wrapped model
        ddp = DDP(model)
        try:
            convert(ddp, "syncbn")
            out["refused"] = None
        except BnlabError as e:
            out["refused"] = str(e)
        dist.teardown()
        return out
    if mode == "before":
        ddp = DDP(convert(model, "syncbn"))
    else:
        ddp = DDP(model, find_unused_parameters=mode == "after, find_unused_parameters")
        convert(ddp.module, "syncbn")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(env.rank)
    done = 0  # steps finished
    try:
        while done < STEPS:
            x = torch.randn(4, 3, 32, 32, generator=g) + env.rank  # ranks see different data
            y = torch.randint(0, 10, (4,), generator=g)
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
        out["error"] = None
        bn = [p for m in ddp.module.modules() if hasattr(m, "running_mean")
              for p in (m.weight, m.bias)]
        rest = [p for p in ddp.module.parameters() if all(p is not q for q in bn)]
        for name, params in (("bn_affine", bn), ("other", rest)):
            flat = torch.cat([p.detach().flatten() for p in params])
            ref = flat.clone()
            torch.distributed.broadcast(ref, 0)
            worst = ref.sub(flat).abs().max()
            torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
            out[f"max_rank_diff_{name}"] = float(worst)
    except RuntimeError as e:
        out["error"], out["failed_at_step"] = _first(e), done + 1
    dist.teardown(wait_for_others=False)
    return out


def convert_after_wrap() -> dict:
    from bnlab import dist

    modes = ["before", "after", "after, find_unused_parameters", "bnlab"]
    return {m: dist.launch_local(_convert_worker, 2, m)[0] for m in modes}


# -- 2: every process started as rank 0 --------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_rank_zero(timeout_s: int = 10) -> dict:
    """Two processes, both RANK=0 of WORLD_SIZE=2: torch's init_process_group alone, and
    bnlab's train.py; each process's exit status, first error line and time to fail."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    torch_alone = ("import datetime, torch.distributed as d; d.init_process_group('gloo', "
                   f"timeout=datetime.timedelta(seconds={timeout_s}))")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in (
            ("torch alone", [sys.executable, "-c", torch_alone]),
            ("bnlab train.py", [sys.executable, str(ROOT / "train.py"), "data=synthetic",
                                "data.num_train=64", "data.num_val=32", "model=resnet20",
                                "batch_per_gpu=4", "epochs=1", "norm=syncbn",
                                f"dist.timeout_s={timeout_s}", "progress=false"]),
        ):
            port, t0 = str(_free_port()), time.perf_counter()
            procs = [subprocess.Popen(
                [*cmd, *([f"hydra.run.dir={tmp}/{name[0]}{i}"] if "train" in name else [])],
                cwd=tmp, env={**env, "MASTER_PORT": port}, stderr=subprocess.PIPE, text=True)
                for i in range(2)]
            res = []
            for p in procs:
                err = p.communicate(timeout=10 * timeout_s + 60)[1]
                lines = [ln for ln in err.splitlines() if ln.strip()]
                said = [ln for ln in lines if ln.startswith("bnlab: error:")]
                res.append({"exit": p.returncode, "traceback": "Traceback" in err,
                            "message": (said or lines[-1:] or [""])[0],
                            "seconds": round(time.perf_counter() - t0, 1)})
            out[name] = res
    return out


# -- 3: BN with 1 value per channel ------------------------------------------------------------

def one_value() -> dict:
    """resnet18 at 1 image per rank: layer4's BN sees 1 value per channel (32x32 input)."""
    import torch

    from bnlab.models import build_model

    out = {}
    model = build_model("resnet18").train()
    try:
        model(torch.randn(1, 3, 32, 32))
        out["torch alone"] = {"error": None}
    except ValueError as e:
        out["torch alone"] = {"error": _first(e)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("bnlab bn, 1 image per rank", ["norm=bn"]),
                            ("bnlab syncbn, 2 ranks x 1 image", ["norm=syncbn",
                                                                 "dist.simulate=2"])):
            p = subprocess.run([sys.executable, str(ROOT / "train.py"), "model=resnet18",
                                "data=synthetic", "data.num_train=16", "data.num_val=8",
                                "batch_per_gpu=1", "epochs=1", "progress=false", *extra,
                                f"hydra.run.dir={tmp}/{len(out)}"], cwd=tmp,
                               capture_output=True, text=True, timeout=300)
            said = sorted((ln for ln in p.stderr.splitlines() if ln.startswith("bnlab: ")),
                          key=lambda ln: not ln.startswith("bnlab: error:"))  # errors first
            out[name] = {"exit": p.returncode, "traceback": "Traceback" in p.stderr,
                         "message": (said or [""])[0]}
    return out


CASES: dict[str, tuple[str, Callable[[], dict]]] = {
    "convert_after_wrap": ("SyncBN conversion after DDP wrapping", convert_after_wrap),
    "all_rank_zero": ("every process started as rank 0", all_rank_zero),
    "one_value": ("BN sees 1 value per channel", one_value),
}


# -- the table and the verdict, from results.json -----------------------------------------------

def _run(r: dict) -> str:
    if r.get("error"):
        return f"fails at step {r['failed_at_step']}: `{r['error'][:160]}...`"
    return (f"trains {STEPS} steps; largest difference between the ranks' BN weights and "
            f"biases {r['max_rank_diff_bn_affine']:.3g}, other parameters "
            f"{r['max_rank_diff_other']:.3g}")


def _short(msg: str) -> str:
    """bnlab's sentences whole; torch's error lines cut at 200 characters."""
    return msg if msg.startswith("bnlab: ") or len(msg) <= 200 else msg[:200] + "..."


def _procs(rs: list[dict]) -> str:
    return "; ".join(f"exit {r['exit']} after {r['seconds']} s"
                     f"{' with a traceback' if r['traceback'] else ''}: `{_short(r['message'])}`"
                     for r in rs)


def table(res: dict) -> str:
    c, z, o = res["convert_after_wrap"], res["all_rank_zero"], res["one_value"]
    rows = [
        ("SyncBN conversion after DDP wrapping", "convert before wrapping (correct)",
         _run(c["before"]), "what the trainer does: `build_net` converts, then `wrap`"),
        ("", "convert `ddp.module` after `DDP(model)`", _run(c["after"]), ""),
        ("", "the same, with `find_unused_parameters=True` (the error's advice)",
         _run(c["after, find_unused_parameters"]), ""),
        ("", "`convert(ddp_model, 'syncbn')`", "", "refused: `" + str(
            c["bnlab"]["refused"]) + "`"),
        ("every process started as rank 0", "2 processes, `RANK=0 WORLD_SIZE=2`, "
         "`init_process_group`", _procs(z["torch alone"]), ""),
        ("", "the same with `train.py`", "", _procs(z["bnlab train.py"])),
        ("BN sees 1 value per channel", "torchvision resnet18, 1 image (layer4 is 1x1)",
         o["torch alone"]["error"] or "no error", ""),
        ("", "`train.py model=resnet18 batch_per_gpu=1 norm=bn`", "",
         f"exit {o['bnlab bn, 1 image per rank']['exit']}: "
         f"`{o['bnlab bn, 1 image per rank']['message']}`"),
        ("", "the same with `norm=syncbn dist.simulate=2` (2 values over the ranks)", "",
         f"exit {o['bnlab syncbn, 2 ranks x 1 image']['exit']}: "
         f"`{o['bnlab syncbn, 2 ranks x 1 image']['message'] or '(trains)'}`"),
    ]
    v = verdict(res)
    lines = ["# Conversion and launch pitfalls (C11)", "",
             TABLE.generated + " from "
             f"`results.json`, measured {res['date']} at commit `{str(res['commit'])[:10]}` on "
             f"{res['machine']}; torch {res['torch']}. Resnet20 (resnet18 for the last case) "
             f"on generated images, 2 gloo processes, {STEPS} steps at lr 0.1, each rank "
             "drawing different images.", "", results_kernels(res), "",
             "| pitfall | set-up | torch on its own | bnlab |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {x} | {y} |" for a, b, x, y in rows]
    lines += ["", f"**C11 verdict: {v.verdict}.** {v.why}", ""]
    return "\n".join(lines)


def verdict(res: dict) -> Verdict:
    """C11: silent harm from converting after wrapping, or from all-rank-0 launches."""
    unused = res["convert_after_wrap"]["after, find_unused_parameters"]
    silent = not unused.get("error") and unused["max_rank_diff_bn_affine"] > 1e-6 \
        and unused["max_rank_diff_other"] < 1e-6
    loud = all(r["exit"] != 0 for r in res["all_rank_zero"]["torch alone"])
    after = res["convert_after_wrap"]["after"]
    failed = f"error at step {after['failed_at_step']}" if after.get("error") else "no error"
    ours = (f"after wrapping: {failed}; with find_unused_parameters BN weights differ across "
            f"ranks by {unused.get('max_rank_diff_bn_affine', float('nan')):.3g} after "
            f"{STEPS} steps; "
            f"all rank 0: {'no process group forms' if loud else 'processes ran'}")
    if silent and not loud:
        v, why = "reproduced", "both mistakes train without error while the ranks diverge."
    elif silent:
        v, why = "partly", (
            "Converting after wrapping fails at once in DDP (torch " + res["torch"] + "), but "
            "following the error's advice (`find_unused_parameters=True`) trains with the new "
            "BN weights outside DDP's gradient sync, so each rank drifts to its own BN "
            "weights: a silent harm, shown here in parameters, not in accuracy. Starting "
            "every process as rank 0 cannot train at all: no process group forms. bnlab "
            "refuses the first through `convert` and turns the second into one sentence.")
    else:
        v, why = "not reproduced", "neither mistake trains silently here."
    return Verdict("C11", "make table-pitfalls", "worse SyncBN results than plain DDP", ours,
                   v, why)


def measure(ctx: Context | None = None) -> dict:
    """Every case, run now, with where and with what it ran."""
    import torch

    from bnlab import floatenv
    from bnlab.rundir import git_commit, machine

    res = {"date": time.strftime("%Y-%m-%d"), "commit": git_commit(), "machine": machine(),
           "torch": torch.__version__, "floats": floatenv.record()}
    for key, (title, fn) in CASES.items():
        print(f"{title} ...", flush=True)
        res[key] = fn()
    return res


def verdicts(res: dict) -> list[Verdict]:
    return [verdict(res)]


TABLE = Table("pitfalls", ("C11",), Context.results, table, verdicts, measure=measure)
