"""How a run computes: its precision (fp32, or bf16 / fp16 autocast) and memory format.

`precision=bf16|fp16` runs the forward passes (training, evaluation, PreciseBN) under
`torch.autocast`: convolutions and matmuls in the half type, the loss and every bnlab norm's
batch statistics and running buffers in float32 (as torch's BatchNorm keeps them). fp16 adds a
gradient scaler (its gradients underflow without one); bf16 has fp32's range and needs none.
`channels_last=true` stores the model's 4-d weights and the training images channels-last
(NHWC), the layout GPU convolutions are fastest in. `precision=fp32` with
`channels_last=false` (the defaults) changes nothing: every earlier run computes as it did.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """One run's autocast, gradient scaler and memory format."""

    def __init__(self, precision: str = "fp32", channels_last: bool = False,
                 device: torch.device | str = "cpu"):
        self.name, self.dtype = precision, PRECISIONS[precision]
        self.device_type = torch.device(device).type
        self.channels_last = channels_last
        # fp16's gradients underflow without loss scaling; bf16 has fp32's exponent range
        self.scaler = torch.amp.GradScaler(self.device_type) if precision == "fp16" else None

    @classmethod
    def of(cls, cfg: dict, device: torch.device | str) -> Precision:
        return cls(cfg.get("precision", "fp32"), cfg.get("channels_last", False), device)

    def autocast(self):
        """The forward passes' context: autocast to the run's half type, or nothing for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def model(self, model: nn.Module) -> nn.Module:
        """The model's 4-d weights channels-last (in place), or as they are."""
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def images(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of images in the run's memory format."""
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, opt: torch.optim.Optimizer) -> None:
        """The optimizer step; with fp16's scaler, skipped where a gradient is not finite
        (the scaler then lowers its scale)."""
        if self.scaler is None:
            opt.step()
            return
        self.scaler.step(opt)
        self.scaler.update()

    def state_dict(self) -> dict:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


FP32 = Precision()  # the default: no autocast, no scaler, contiguous
