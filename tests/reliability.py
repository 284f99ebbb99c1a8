"""Every bad input and fault bnlab is tried against, in one list shared by the tests and
docs/reliability.md.

    python tests/reliability.py       # run every bad-input case, rewrite docs/reliability.md

`tests/test_reliability.py` runs the same cases and checks that each still behaves as the
document says (same exit status, same message), so the document cannot go stale.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import CIFAR_MINI, ROOT, SMOKE, run_here  # noqa: E402

DOC = ROOT / "docs" / "reliability.md"
BASE = [a for a in SMOKE if not a.startswith("data.root")] + [f"data.root={CIFAR_MINI}"]


@dataclass
class Case:
    name: str
    args: list[str]                      # after `python train.py` (or `script`)
    code: int                            # expected exit status
    setup: Callable[[Path], None] | None = None
    script: str = "train.py"
    base: list[str] = field(default_factory=lambda: list(BASE))

    def command(self) -> str:
        shown = [a.replace(str(CIFAR_MINI), "$DATA").replace("<root>/", "") for a in self.args]
        return f"python {self.script} " + " ".join(shown)


def _completed_run(tmp: Path) -> None:
    d = tmp / "done"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1}\n')
    (d / "status.json").write_text(json.dumps({"status": "completed", "step": 1}) + "\n")


def _corrupt_batch(tmp: Path) -> None:
    src = CIFAR_MINI / "cifar-10-batches-py"
    dst = tmp / "cifar" / "cifar-10-batches-py"
    shutil.copytree(src, dst)
    f = dst / "data_batch_1"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])


def _unfinished_with_corrupt_checkpoint(tmp: Path) -> None:
    """A run killed mid-training whose checkpoint file was cut short."""
    import yaml
    from test_configs import compose_train

    d = tmp / "crashed"
    d.mkdir()
    cfg = compose_train(BASE)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "status.json").write_text(json.dumps({"status": "failed"}) + "\n")
    (d / "checkpoint.pt").write_bytes(b"PK\x03\x04 truncated")


def _garbage_checkpoint(tmp: Path) -> None:
    (tmp / "bad.pt").write_bytes(b"not a checkpoint")


CASES = [
    Case("unknown norm name", ["norm=nope"], 2),
    Case("unknown model name", ["model=resnet99"], 2),
    Case("unknown data name", ["data=imagenet"], 2),
    Case("unknown config key", ["no_such_key=1"], 2),
    Case("a new key that no config declares (+)", ["+foo=1"], 2),
    Case("PreciseBN samples fewer than one batch", ["precise_bn=every_epoch",
                                                      "precise_bn.num_samples=1"], 2),
    Case("a held-out split as large as the training set", ["data.holdout=256"], 2),
    Case("batch_per_gpu 0", ["batch_per_gpu=0"], 2),
    Case("fp16 on a machine without CUDA", ["precision=fp16", "dist.device=cpu"], 2),
    Case("an unknown precision", ["precision=fp8"], 2),
    Case("batch_per_gpu negative", ["batch_per_gpu=-2"], 2),
    Case("batch_per_gpu not an integer", ["batch_per_gpu=2.5"], 2),
    Case("grad_accum 0", ["grad_accum=0"], 2),
    Case("GN groups that do not divide a layer's channels", ["norm=gn", "model=resnet20"], 2),
    Case("BN with 1 value per channel per rank (resnet18, 32x32, 1 image per rank)",
         ["model=resnet18", "batch_per_gpu=1"], 2),
    Case("missing dataset folder, offline",
         ["data.root=<tmp>/no-cifar", "data.download=false"], 2),
    Case("dataset folder with a truncated batch file", ["data.root=<tmp>/cifar"], 2,
         _corrupt_batch),
    Case("unfinished run whose checkpoint is truncated (resume)",
         ["hydra.run.dir=<tmp>/crashed"], 2, _unfinished_with_corrupt_checkpoint),
    Case("corrupt checkpoint given to evaluate.py", ["run=<tmp>/bad.pt"], 2,
         _garbage_checkpoint, script="evaluate.py", base=[]),
    Case("output directory that holds a completed run", ["hydra.run.dir=<tmp>/done"], 2,
         _completed_run),
    Case("unwritable output directory", ["output_dir=/proc/bnlab-out"], 2),
    Case("nproc_per_node larger than the machine allows", ["dist.nproc_per_node=4096"], 2),
    Case("a SLURM option to a sweep without --launcher slurm",
         ["<root>/experiments/jitter/sweep.yaml", "--partition", "gpu", "--dry-run"], 2,
         script="bnlab/lab/sweep.py", base=[]),
    Case("a SLURM layout that does not fit a run's ranks (4 ranks on 3 nodes)",
         ["<root>/experiments/jitter/sweep.yaml", "--data", str(CIFAR_MINI), "--runs",
          "<tmp>/runs", "--launcher", "slurm", "--nodes", "3"], 2, script="bnlab/lab/sweep.py",
         base=[]),
]

# Faults that need processes killed or misconfigured mid-run: each checked by the named test.
FAULTS = [
    ("SIGTERM to a sweep, or Ctrl-C in its terminal (SIGINT to every process of the group)",
     "lab/test_sweep.py::test_a_stopped_sweep_checkpoints_its_runs_and_the_same_command_resumes_it",
     "every running job checkpoints and stops as `preempted` (its submitit job passes SIGTERM "
     "to train.py; the jobs ignore the terminal's SIGINT), queued runs do not start, the sweep "
     "exits with 75, and the same command resumes the preempted runs"),
    ("a sweep stopped while a run is still starting",
     "lab/test_sweep.py::test_a_run_stopped_before_it_began_is_not_started",
     "a run that SIGTERM reaches before train.py handles it is reported as not started and its "
     "folder removed, so the next launch starts it afresh (not `failed`)"),
    ("a sweep stopped before its job has started the run",
     "lab/test_sweep.py::test_a_stop_that_comes_while_the_run_starts_reaches_it_once_it_has",
     "the job passes SIGTERM on as soon as it has started the run, and only once; the sweep "
     "asks its running jobs again every 5 s until they end; a job that died before its run "
     "began is reported as not started (`job_result`)"),
    ("a SLURM sweep stopped (SIGTERM or Ctrl-C) while it waits for its jobs",
     "lab/test_sweep_slurm.py::test_a_stopped_slurm_sweep_cancels_queued_jobs_then_asks_running"
     "_ones_to_checkpoint",
     "queued jobs are cancelled first, so none starts meanwhile; running ones get SIGTERM "
     "(`scancel --signal=TERM`) and checkpoint; the same command resubmits and resumes them"),
    ("the same SLURM sweep command again while its jobs are still queued or running",
     "lab/test_sweep_slurm.py::test_a_second_command_follows_runs_still_on_slurm_to_their_end",
     "nothing is submitted twice: the runs whose job sacct (or, on a cluster without "
     "accounting, squeue) still lists are followed to their end, and only then are the tables "
     "written; with --no-wait the command submits what is left and returns"),
    ("a SLURM job that sacct does not know (accounting off, or purged)",
     "lab/test_sweep_slurm.py::test_a_job_sacct_does_not_know_is_asked_of_squeue",
     "squeue is asked: a job it lists is followed, one it does not is gone and its run is "
     "submitted again (resuming from its checkpoint)"),
    ("`python train.py` in the batch script of a SLURM job of several tasks",
     "test_dist.py::test_slurm_tasks_become_ranks_and_share_one_run_directory",
     "one process, not rank 0 of the job's tasks (only an srun step's tasks become ranks); "
     "the run directory is named after the job, or after the step in an srun step"),
    ("`srun -N2 -n2 python train.py` from a machine that runs no rank (a login node)",
     "lab/test_slurm.py::test_a_run_over_two_nodes_has_one_directory_wherever_srun_starts_it",
     "rank 0's address is the step's first node (SLURM_STEP_NODELIST), not the address srun "
     "ran from, so the ranks meet; one run directory, `slurm-<job>.0`, on either node"),
    ("a job on a real SLURM cluster reaches its time limit (make test-slurm)",
     "lab/test_slurm.py::test_a_job_warned_of_its_time_limit_checkpoints_is_requeued_and_resumes",
     "SLURM's SIGUSR2 reaches the job 60 to 90 s before the limit; the run checkpoints, "
     "submitit requeues the job (as often as it takes, at most 3 times) and it resumes the run "
     "to the end"),
    ("SIGUSR2 to a sweep's job (SLURM's warning before a time limit)",
     "lab/test_sweep.py::test_a_preempted_local_job_checkpoints_is_requeued_and_resumes",
     "the run checkpoints, submitit requeues the job (its `checkpoint` hook), and the job "
     "resumes the run from its checkpoint to the end; sweep.json counts 2 launches"),
    ("kill -9 mid-epoch, then the same command again",
     "test_resume.py::test_kill_9_mid_epoch_then_resume_reproduces_the_run_bitwise",
     "status stays `running`; the relaunch resumes from the last checkpoint (`resume=auto`), "
     "drops metrics lines past it (and a torn last line), and ends with the same parameters, "
     "buffers, optimizer state and metrics.jsonl as the uninterrupted run, bit for bit"),
    ("SIGTERM (or SIGUSR1, SIGUSR2) during training",
     "test_resume.py::test_sigterm_checkpoints_at_the_next_step_and_the_next_launch_resumes",
     "checkpoint at the next step boundary, status `preempted` with the step and signal, exit "
     "75; the next launch resumes and reproduces the uninterrupted run bitwise"),
    ("one of 2 gloo ranks killed (-9) mid-training",
     "test_resume.py::test_a_dead_rank_stops_the_others_marks_the_run_failed_and_relaunch_resumes",
     "the other rank stops within seconds (gloo: connection reset), status `failed` with the "
     "error, one-sentence message, exit 1; relaunching resumes bitwise from the last checkpoint"),
    ("NaN / inf training loss (lr 1e6)",
     "test_resume.py::test_nan_loss_marks_the_run_diverged_and_a_multirun_goes_on",
     "stops at the next log line, status `diverged` with the step, exit 3; in a `-m` multirun "
     "the other jobs go on (`on_nan=continue` keeps training)"),
    ("a run directory whose run is still running, finished or another experiment",
     "test_resume.py::test_finished_live_or_refused_runs_are_never_resumed",
     "refused with one sentence: completed and diverged runs are never overwritten, a live "
     "run (same host, pid alive) is not touched, a changed model/norm/batch is not resumed"),
    ("every process started as RANK=0 (WORLD_SIZE=2, same MASTER_PORT)",
     "test_dist.py::test_two_processes_both_started_as_rank_0_get_one_sentence_each",
     "each process exits with 2 and one sentence: the port is in use, or the processes did not "
     "all join within `dist.timeout_s`; both name the fix (each process its own RANK, as "
     "torchrun gives); no run starts"),
]


def run_case(case: Case, tmp: Path) -> tuple[int, str, str]:
    """(exit status, the message with <tmp> for the temp folder, all output)."""
    if case.setup:
        case.setup(tmp)
    args = [a.replace("<tmp>", str(tmp)).replace("<root>", str(ROOT)) for a in case.args]
    out = [f"output_dir={tmp}/out"] if case.script == "train.py" and not any(
        a.startswith(("output_dir=", "hydra.run.dir=")) for a in args) else []
    r = run_here(case.script, *case.base, *args, *out, cwd=tmp)
    text = r.stderr + r.stdout
    msgs = [ln for ln in r.stderr.splitlines() if ln.startswith("bnlab: error:")]
    msg = msgs[0] if msgs else (r.stderr.strip().splitlines() or [""])[-1]
    msg = msg.replace(str(tmp), "<tmp>").replace(str(CIFAR_MINI), "$DATA")
    return r.returncode, re.sub(r"\s+", " ", msg), text


def row(name: str, command: str, observed: str) -> str:
    cell = observed.replace("|", "\\|")
    return f"| {name} | `{command}` | {cell} |"


def write_doc() -> None:
    lines = [
        "# Reliability: every fault and bad input tried",
        "",
        "Generated by `python tests/reliability.py` (each case below was run); "
        "`tests/test_reliability.py` runs the same cases and fails when the behaviour no "
        "longer matches this page. `$DATA` is the CIFAR-10 folder; every command also carries "
        "a short smoke config (`tests/conftest.py`, `SMOKE`) and `output_dir=<tmp>/out`.",
        "",
        "Exit statuses: 0 completed, 1 a rank failed (relaunch to resume), 2 refused before "
        "anything started, 3 diverged, 75 preempted (relaunch to resume).",
        "",
        "## Bad input",
        "",
        "Each: one sentence, no traceback, non-zero exit, nothing overwritten, no half-made "
        "run directory left behind.",
        "",
        "| bad input | command | observed (exit status: message) |",
        "|---|---|---|",
    ]
    for case in CASES:
        with tempfile.TemporaryDirectory() as t:
            code, msg, _ = run_case(case, Path(t))
        lines.append(row(case.name, case.command(), f"{code}: {msg}"))
        print(f"{code}  {case.name}: {msg}", flush=True)
    lines += ["", "## Faults during a run", "",
              "| fault | checked by (tests/) | observed behaviour |",
              "|---|---|---|"]
    lines += [row(name, test, what) for name, test, what in FAULTS]
    lines += ["", "wandb with no network: `logger=wandb` picks offline mode before `wandb.init` "
              "when no API key is configured, so it never waits on the network "
              "(`tests/test_train.py::test_wandb_logger_goes_offline_without_an_api_key`).", ""]
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text("\n".join(lines))
    print(f"wrote {DOC}")


def documented() -> dict[str, str]:
    """Bad-input name -> the observed cell, as docs/reliability.md records it."""
    out = {}
    for line in DOC.read_text().splitlines():
        parts = [p.strip() for p in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(parts) == 3:
            out[parts[0]] = parts[2].replace("\\|", "|")
    return out


if __name__ == "__main__":
    write_doc()
