"""`bnlab runs verify RUN [--steps N] [--as-recorded] [--data DIR]`: re-run the first N steps
of a recorded run at the current code, from its recorded overrides, and say whether it logs
the same numbers to the bit; where not, the first differing step and value, and what differs
in the record (commit, the CPU kernels' capability, threads, torch, the config).

    bnlab runs verify experiments/runs/cifar10-5085/resnet20-bn-4x2-.../seed0 --steps 50

Exit status: 0 bit-identical, 1 a difference, 2 a run directory it cannot re-run.
`--as-recorded` runs the kernels of the recorded capability where this CPU can emulate it
(a narrower one: ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA) and the recorded kernel variables.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bnlab import floatenv
from bnlab.errors import BnlabError
from bnlab.lab.identity import first_difference, logged
from bnlab.metrics import read_jsonl
from bnlab.paths import ROOT, need_checkout
from bnlab.rundir import (
    RESUME_MAY_CHANGE,
    changed_keys,
    git_commit,
    pinned,
    without,
    without_added_later,
)

# Overrides that say where a run reads and writes and how long it runs: verify sets its own.
OWN = ("hydra.run.dir", "output_dir", "data.root", "data.download", "max_steps", "checkpoint",
       "checkpoint_every", "progress", "resume", "dist.threads", "logger", "name")
SKIP = ("images_per_s", "time/", "epoch")  # logged values that are not the run's floats


def recorded(run: Path) -> tuple[dict, dict, list[dict]]:
    """run.json, config.yaml and metrics.jsonl of a run directory; a BnlabError naming what is
    missing where it is no complete bnlab run."""
    run = Path(run)
    if not run.is_dir():
        raise BnlabError(f"{run} is not a directory; pass a run directory (one holding "
                         "run.json, config.yaml and metrics.jsonl).")
    missing = [f for f in ("run.json", "config.yaml", "metrics.jsonl") if not (run / f).is_file()]
    if missing:
        raise BnlabError(f"{run} holds no {' and no '.join(missing)}: not a bnlab run directory "
                         "(or one whose run never started); pass a run's own directory.")
    info = json.loads((run / "run.json").read_text())
    if "overrides" not in info:
        raise BnlabError(f"{run}/run.json records no overrides (a run launched otherwise than "
                         "by train.py); verify re-runs only what train.py recorded.")
    return info, yaml.safe_load((run / "config.yaml").read_text()), read_jsonl(
        run / "metrics.jsonl")


def threads_of(run: Path, info: dict) -> int:
    """The threads the run computed with: its record's, else its sweep's, else 1."""
    if (info.get("floats") or {}).get("threads"):
        return int(info["floats"]["threads"])
    sweep = Path(run) / "sweep.json"
    if sweep.is_file():
        return int(json.loads(sweep.read_text()).get("threads") or 1)
    return 1


def kernel_env(info: dict, as_recorded: bool, capability: str | None) -> tuple[dict, str]:
    """The environment to re-run in, and how its kernels were chosen, in words."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(floatenv.ENV_PREFIXES)}
    want = capability or (floatenv.capability_of(info) if as_recorded else None)
    if as_recorded:
        env.update((info.get("floats") or {}).get("kernel_env", {}))
    if want is None:
        return env, f"this CPU's kernels ({floatenv.record()['cpu_capability']})"
    if not floatenv.can_emulate(want):
        raise BnlabError(f"the run's kernels ({want}) are wider than this CPU's "
                         f"({floatenv.record()['cpu_capability']}): they cannot be emulated "
                         "here; verify it on a CPU that has them.")
    env.update(floatenv.EMULATE.get(want, {}))
    return env, f"{want} kernels" + (" (emulated)" if want != floatenv.record()[
        "cpu_capability"] else "")


def rerun(run: Path, steps: int, data: str | None, env: dict, threads: int, info: dict,
          cfg: dict, where: Path) -> Path:
    """train.py with the run's overrides for `steps` steps into `where`; its run directory."""
    mine = ("max_steps=", *[f"{k}=" for k in OWN])
    overrides = [o for o in info["overrides"] if not o.lstrip("+~").startswith(mine)]
    out = where / "run"
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"max_steps={steps}",
           f"hydra.run.dir={out}", f"data.root={data or cfg['data']['root']}",
           "data.download=false", "checkpoint=false", "progress=false", "resume=never",
           f"dist.threads={threads}"]
    env = {**env, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        last = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise BnlabError(f"re-running {run} failed (exit {p.returncode}): {last[0]}")
    return out


def verify(run: Path, steps: int = 50, as_recorded: bool = False, data: str | None = None,
           capability: str | None = None) -> dict:
    """The re-run compared with the record: {identical, compared, first, record, config}."""
    info, cfg, rows = recorded(run)
    if steps < 1:
        raise BnlabError(f"--steps {steps} re-runs nothing; give a positive number of steps.")
    want = logged(rows, SKIP, steps)
    if not any(k == "train/loss" for _, k in want):
        raise BnlabError(f"{run} logged no train/loss at or before step {steps} (it logs every "
                         f"{cfg.get('log_every', '?')} steps); raise --steps to at least that.")
    env, kernels = kernel_env(info, as_recorded, capability)
    threads = threads_of(run, info)
    with tempfile.TemporaryDirectory(prefix="bnlab-verify-") as tmp:
        out = rerun(run, steps, data, env, threads, info, cfg, Path(tmp))
        now_info = json.loads((out / "run.json").read_text())
        now_cfg = yaml.safe_load((out / "config.yaml").read_text())
        got = logged(read_jsonl(out / "metrics.jsonl"), SKIP, steps)
    same, first = first_difference(want, got)

    def exp(c: dict) -> dict:
        return pinned(without_added_later(without(c, RESUME_MAY_CHANGE)))

    record = {"commit": (info.get("commit"), now_info.get("commit")),
              "capability": (floatenv.capability_of(info), floatenv.capability_of(now_info)),
              "cpu": (floatenv.vendor_of(info.get("floats")),
                      floatenv.vendor_of(now_info.get("floats"))),
              "threads": (threads, (now_info.get("floats") or {}).get("threads")),
              "torch": (info.get("versions", {}).get("torch"),
                        now_info.get("versions", {}).get("torch")),
              "floats": floatenv.differences(info.get("floats"), now_info.get("floats"))}
    return {"identical": first is None and bool(same), "compared": len(same), "first": first,
            "record": record, "config": changed_keys(exp(cfg), exp(now_cfg)),
            "kernels": kernels, "steps": steps}


def said(run: Path, v: dict) -> str:
    """The verdict in a few lines."""
    rec = v["record"]
    def short(x) -> str:
        if x is None:
            return "not recorded"
        head, dash, tail = str(x).partition("-")  # a commit: 40 hex digits, maybe "-dirty"
        return head[:7] + dash + tail if len(head) == 40 else str(x)

    was = [f"{k} {short(a)} -> {short(b)}" for k, (a, b) in
           ((k, rec[k]) for k in ("commit", "capability", "cpu", "threads", "torch")) if a != b]
    if v["config"]:
        was.append(f"config keys {', '.join(v['config'])}")
    head = (f"bit-identical: the first {v['steps']} steps re-run at {short(git_commit())} on "
            f"{v['kernels']} log the same {v['compared']} values as {run} recorded."
            if v["identical"] else
            f"differs: at step {v['first'][0]}, {v['first'][1]} recorded {v['first'][2]!r}, "
            f"now {v['first'][3]!r} (re-run on {v['kernels']}; {v['compared']} values "
            "compared)." if v["first"] else "no logged value to compare.")
    hint = ""
    if not v["identical"] and rec["capability"][0] is None:
        hint = ("\n  its record names no capability (runs before run.json's floats): on a CPU "
                "with AVX-512, --capability AVX2 re-runs it on AVX2 kernels")
    elif not v["identical"] and None not in rec["cpu"] and rec["cpu"][0] != rec["cpu"][1]:
        hint = (f"\n  it was made on a {rec['cpu'][0]} CPU and this one is {rec['cpu'][1]}: "
                "emulating a capability does not reproduce kernels tuned to another vendor's "
                "CPU; verify it on one of its vendor")
    return head + ("\n  what differs in the record: " + "; ".join(was) if was else
                   "\n  the record differs in nothing verify reads") + hint


def main(argv: list[str], prog: str = "bnlab") -> int:
    p = argparse.ArgumentParser(prog=f"{prog} runs verify", description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a run directory (run.json, config.yaml, metrics.jsonl)")
    p.add_argument("--steps", type=int, default=50, help="steps to re-run (default 50)")
    p.add_argument("--as-recorded", action="store_true",
                   help="emulate the recorded CPU capability and kernel variables")
    p.add_argument("--capability", choices=floatenv.ORDER,
                   help="run these kernels (a run that predates the record names none)")
    p.add_argument("--data", help="the folder holding cifar-10-batches-py (default: recorded)")
    a = p.parse_args(argv)
    need_checkout(f"{prog} runs verify")  # it re-runs train.py at the checkout's code
    v = verify(a.run, a.steps, a.as_recorded, a.data, a.capability)
    print(said(a.run, v))
    return 0 if v["identical"] else 1
