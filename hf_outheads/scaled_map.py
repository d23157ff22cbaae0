"""`ScaledMap`: the linear map `x -> W x + b` of `bilinear` and `joint`, stored as
`W = base * I + scale * A` with `A` the parameter.

Adam-type optimisers move each entry of a parameter by about the learning rate per step,
whatever its gradient's size. A `d x d` map between the backbone's final state and `E` then
changes the scores of every word at once, much faster than the rows of `E` move; learned at
the backbone's rate, it made `bilinear` and `joint` train to worse models than `tied`, and at
a rate 100 times lower it did not. With `W = base I + scale A`, a step of `A` moves `W` `scale` times as far, under any such optimiser
and with no per-parameter-group setup; weight decay on `A` pulls `W` towards `base I`.
`scale = 1, base = 0` is the plain parameterisation. `MapOptions` declares the two options
of the heads built on it (`bilinear`, `joint`): `init` and `map_scale`.

A head converted from a trained model (`from_backbone`) is another case: the backbone and E
have already learnt, the maps start at the exact `tied`, and learnt at the full rate
(`map_scale` 1) they made both fine-tuning comparisons better than `tied`, where 0.01 kept
the head at `tied`'s level. `map_scale` left unset (None) is therefore small from scratch
(`scratch_defaults`: 0.01; `bilinear` 0.1) and 1 when converted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .options import choice, number
from .softmax import EncodedLabelsOptions

INITS = ("identity", "uniform")
REFERENCE_BOUND = 0.1  # the reference codes' init: every parameter uniform(-0.1, 0.1)


@dataclass
class MapOptions(EncodedLabelsOptions):
    """init: "identity" (the maps start at a (semi-)identity: the head starts as `tied`) or
    "uniform" (the reference codes); map_scale: how far a step of the stored parameter moves a
    map (1: the plain form; the paper form is `init: uniform, map_scale: 1`); None: 0.01 from
    scratch (`bilinear`: 0.1), 1 when converted from a trained head (measured, see the module
    docstring)."""

    init: str = choice("identity", INITS)
    map_scale: float | None = number(None, 0.0, 1.0, open_low=True, optional=True)
    scratch_defaults: ClassVar[dict] = {"map_scale": 0.01}  # measured (the repository's ablations)
    conversion_defaults: ClassVar[dict] = {"map_scale": 1.0}  # measured (the repository's ablations)


class ScaledMap(nn.Module):
    """`W x + b` with `W = base * I + scale * weight` (`I` the (semi-)identity, `out x in`);
    `base` is `gain` with the options' identity init, 0 with the reference init."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool, options: MapOptions, gain: float = 1.0):
        super().__init__()
        self.scale, self.base = options.map_scale, (gain if options.init == "identity" else 0.0)
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))  # A
        self.bias = nn.Parameter(torch.empty(out_dim)) if bias else None

    def effective_weight(self) -> torch.Tensor:
        weight = self.scale * self.weight
        if self.base:
            weight = weight + self.base * torch.eye(*weight.shape, dtype=weight.dtype, device=weight.device)
        return weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`scale * (A x) + base * (I x) + b`: elementwise work on x's rows, not on a d x d
        weight and identity rebuilt per call (which a one-position generation step notices)."""
        out = F.linear(x, self.weight) * self.scale
        if self.base:
            out_dim, in_dim = self.weight.shape
            identity = x[..., :out_dim] if out_dim <= in_dim else F.pad(x, (0, out_dim - in_dim))
            out = out + self.base * identity
        return out if self.bias is None else out + self.bias

    def reset(self) -> None:
        """Identity init: `W = base I` (`A = 0`), bias 0. Reference init (`base = 0`): every
        parameter of `W` and `b` uniform(-0.1, 0.1)."""
        bound = 0.0 if self.base else REFERENCE_BOUND
        init.uniform_(self.weight, -bound / self.scale, bound / self.scale)  # zeros when bound is 0
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    @torch.no_grad()
    def set_effective_weight(self, weight: torch.Tensor) -> None:
        """Store `A` so that `effective_weight()` is `weight` (conversion from a trained head)."""
        eye = torch.eye(*weight.shape, dtype=weight.dtype, device=weight.device)
        self.weight.copy_((weight - self.base * eye) / self.scale)
