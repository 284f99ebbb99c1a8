"""Weight Standardization (Qiao et al. 2019, arXiv:1903.10520) for `norm=gnws`: GroupNorm with
the convolutions that feed it standardized, the micro-batch recipe of BiT and of detection
backbones.

`WSConv2d` standardizes its weight at every forward (each output channel's weights to mean 0
and variance 1 over its inputs and kernel, biased variance + eps under the root, as timm's
StdConv2d), so the parameter stays the raw weight the optimizer steps on. `feeding_convs`
finds, for each normalization layer, the convolution whose output it normalizes.
"""

from __future__ import annotations

import torch
import torch.nn as nn


class WSConv2d(nn.Conv2d):
    """nn.Conv2d whose weight is standardized per output channel at forward time."""

    def __init__(self, *args, eps: float = 1e-6, **kw):
        super().__init__(*args, **kw)
        self.eps = eps

    def extra_repr(self) -> str:
        return super().extra_repr() + f", eps={self.eps}"

    def standardized(self) -> torch.Tensor:
        """The weight the convolution uses: (w - mean) / sqrt(var + eps) per output channel."""
        w = self.weight
        flat = w.reshape(w.shape[0], -1)
        var, mean = torch.var_mean(flat, dim=1, unbiased=False, keepdim=True)
        return ((flat - mean) * torch.rsqrt(var + self.eps)).reshape_as(w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.standardized(), self.bias)


def from_conv(conv: nn.Conv2d, eps: float = 1e-6) -> WSConv2d:
    """A WSConv2d with `conv`'s shape, parameters (raw), requires_grad, device, dtype and
    train/eval flag."""
    ws = WSConv2d(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                  conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                  conv.padding_mode, eps=eps, device=conv.weight.device,
                  dtype=conv.weight.dtype)
    with torch.no_grad():
        for name in ("weight", "bias"):
            src, dst = getattr(conv, name), getattr(ws, name)
            if src is not None:
                dst.copy_(src)
                dst.requires_grad_(src.requires_grad)
    return ws.train(conv.training)


def to_conv(ws: WSConv2d) -> nn.Conv2d:
    """A plain nn.Conv2d holding the standardized weight: the same function, no standardizing
    (what `revert` gives back)."""
    conv = nn.Conv2d(ws.in_channels, ws.out_channels, ws.kernel_size, ws.stride, ws.padding,
                     ws.dilation, ws.groups, ws.bias is not None, ws.padding_mode,
                     device=ws.weight.device, dtype=ws.weight.dtype)
    with torch.no_grad():
        conv.weight.copy_(ws.standardized())
        conv.weight.requires_grad_(ws.weight.requires_grad)
        if ws.bias is not None:
            conv.bias.copy_(ws.bias)
            conv.bias.requires_grad_(ws.bias.requires_grad)
    return conv.train(ws.training)


def plain(module: nn.Module | None) -> bool:
    """A torch nn.Conv2d itself: a subclass (timm's Conv2dSame, a lazy or parametrized conv)
    has its own forward, which standardizing would drop, so it is left as it is."""
    return type(module) is nn.Conv2d


def feeding_convs(model: nn.Module, norms: set[str]) -> dict[str, str]:
    """For each normalization layer named in `norms`, the name of the plain nn.Conv2d whose
    output it takes, where one does: read from the model's traced graph (torch.fx); for a layer
    the graph does not show (a model fx cannot trace, or a layer inside a traced-through
    module), the Conv2d registered just before it in the same parent (conv1 -> bn1, a
    Sequential's conv -> bn). A layer fed by anything else gets none: GroupNorm alone."""
    mods = dict(model.named_modules())
    out = {}
    try:
        from torch import fx

        graph = fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 (any model fx cannot trace: data-dependent control flow...)
        graph = None
    seen = set()
    for node in graph.nodes if graph is not None else []:
        if node.op == "call_module" and node.target in norms and node.args:
            seen.add(node.target)
            src = node.args[0]
            if getattr(src, "op", None) == "call_module" and plain(mods.get(src.target)):
                out[node.target] = src.target
    out.update(_by_order(model, norms - seen))
    return out


def _by_order(model: nn.Module, norms: set[str]) -> dict[str, str]:
    out = {}
    for parent_name, parent in model.named_modules():
        before = None
        for name, child in parent.named_children():
            full = f"{parent_name}.{name}" if parent_name else name
            if full in norms and before is not None:
                out[full] = before
            before = full if plain(child) else None
    return out

