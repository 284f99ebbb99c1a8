"""Preemption: SIGTERM, SIGUSR1 or SIGUSR2 (how SLURM, torchrun and submitit stop jobs) asks
the trainer to checkpoint at the next step boundary and leave with status `preempted`."""

from __future__ import annotations

import signal
import threading

import torch

from bnlab import dist

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


class StopRequest:
    """Catches the preemption signals while training; `pending` agrees across ranks."""

    def __init__(self, signals: tuple = SIGNALS):
        self.signum, self.signals = 0, signals
        self._old: dict = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def pending(self, env: dist.DistEnv) -> int:
        """The signal number if any rank was signalled (a max-reduction), else 0."""
        if not env.distributed:
            return self.signum
        t = torch.tensor([self.signum], device=env.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())
