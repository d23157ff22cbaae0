"""`ScaledMap`: the linear map `x -> W x + b` of `bilinear` and `joint`, stored as
`W = base * I + scale * A` with `A` the parameter.

Adam-type optimisers move each entry of a parameter by about the learning rate per step,
whatever its gradient's size. A `d x d` map between the backbone's final state and `E` then
changes the scores of every word at once, much faster than the rows of `E` move; learned at
the backbone's rate, it made `bilinear` and `joint` train to worse models than `tied`, and at
a rate 100 times lower it did not (training/results/ablations_stdlib_lm.md). With
`W = base I + scale A`, a step of `A` moves `W` `scale` times as far, under any such optimiser
and with no per-parameter-group setup; weight decay on `A` pulls `W` towards `base I`.
`scale = 1, base = 0` is the plain parameterisation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init


class ScaledMap(nn.Module):
    """`W x + b` with `W = base * I + scale * weight` (`I` the (semi-)identity, `out x in`)."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool, scale: float, base: float):
        super().__init__()
        self.scale, self.base = scale, base
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))  # A
        self.bias = nn.Parameter(torch.empty(out_dim)) if bias else None

    def effective_weight(self) -> torch.Tensor:
        weight = self.scale * self.weight
        if self.base:
            weight = weight + self.base * torch.eye(*weight.shape, dtype=weight.dtype, device=weight.device)
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight(), self.bias)

    def reset(self, uniform: float = 0.0) -> None:
        """`W = base I` (`A = 0`), or with `uniform > 0` every parameter of `W` and `b`
        uniform(-uniform, uniform) (the reference codes' init); bias 0 otherwise."""
        if uniform:
            init.uniform_(self.weight, -uniform / self.scale, uniform / self.scale)
        else:
            init.zeros_(self.weight)
        if self.bias is not None:
            init.uniform_(self.bias, -uniform, uniform)  # zeros when uniform is 0

    @torch.no_grad()
    def set_effective_weight(self, weight: torch.Tensor) -> None:
        """Store `A` so that `effective_weight()` is `weight` (conversion from a trained head)."""
        eye = torch.eye(*weight.shape, dtype=weight.dtype, device=weight.device)
        self.weight.copy_((weight - self.base * eye) / self.scale)
