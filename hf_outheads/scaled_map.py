"""`ScaledMap`: the package's one scaled linear map, `x -> W x + b` stored as
`W = base * I + scale * A` with `A` the parameter (`I` the (semi-)identity, repeated for a map
that computes several `d`-wide outputs at once), used by `bilinear` (`W_l`), `joint` (U, V) and
the latent maps of the mixtures and `lightrnn` (`W_n`); `MapScaleOptions` declares its option
`map_scale` (= `scale`), whose defaults each head's options state (`scratch_defaults`, ...).

Adam-type optimisers move each entry of a parameter by about the learning rate per step,
whatever its gradient's size. A `d x d` map between the backbone's final state and `E` then
changes the scores of every word at once, much faster than the rows of `E` move; learned at
the backbone's rate, it made `bilinear` and `joint` train to worse models than `tied`, and at
a rate 100 times lower it did not; the mixtures' latent maps likewise. With
`W = base I + scale A`, a step of `A` moves `W` `scale` times as far, under any such optimiser
and with no per-parameter-group setup. `scale = 1, base = 0` is the plain parameterisation.

`base` is what `W` is at `A = 0`, where weight decay pulls it: `bilinear` and `joint` start at
`A = 0` (`base` = the identity init's gain, 0 with the reference init), the latent maps at
`A = I + noise / scale` (`base = 1 - scale` with the identity init, 0 with the reference init),
as the versions that introduced each stored them. The bias `b` is the parameter `c` itself
(`bilinear`, `joint`) or `scale * c` (the latents, whose bias then moves as slowly as the map).

A head converted from a trained model (`from_backbone`) is another case: the backbone and E
have already learnt, the maps start at the exact original, and learnt at the full rate
(`map_scale` 1) they made both fine-tuning comparisons better than `tied`, where 0.01 kept
the head at `tied`'s level. `map_scale` left unset (None) is therefore small from scratch and 1
when converted (each head's `scratch_defaults` and `conversion_defaults`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .head_options import HeadOptions, choice, number
from .softmax import EncodedLabelsOptions

INITS = ("identity", "uniform")
REFERENCE_BOUND = 0.1  # the reference codes' init: every parameter uniform(-0.1, 0.1)


@dataclass
class MapScaleOptions(HeadOptions):
    """The option of every head with a `ScaledMap`. Left unset (None), it takes the head's own
    defaults, which its options class states (`scratch_defaults`, `conversion_defaults` and, for a
    head that had maps before the option, `saved_defaults`: measured, see the module docstring)."""

    map_scale: float | None = number(None, 0.0, 1.0, open_low=True, optional=True, help=(
        "how far a step of a stored parameter moves the head's maps (1: the plain form, the papers'); unset: the "
        "head's default from scratch, 1 when converted from a trained LM head"))


@dataclass
class MapOptions(MapScaleOptions, EncodedLabelsOptions):
    """Options of `bilinear` and `joint` (the paper form is `init: uniform, map_scale: 1`)."""

    init: str = choice("identity", INITS, help=(
        "'identity': the maps start at a (semi-)identity, so the head starts as `tied`; 'uniform': the reference "
        "codes' init"))

    def scaled_map(self, in_dim: int, out_dim: int, bias: bool, gain: float = 1.0) -> "ScaledMap":
        """A map of these options: `A = 0` at the identity init, so `base` is its `gain` (0 with the
        reference init)."""
        return ScaledMap(in_dim, out_dim, bias, self.map_scale, gain if self.init == "identity" else 0.0)


class ScaledMap(nn.Module):
    """`W x + b` with `W = base * I + scale * weight` (`out x in`, `I` the `d x in` (semi-)identity
    repeated `copies` times, `d = out / copies`) and `b = bias` (`scaled_bias`: `scale * bias`)."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool, scale: float, base: float, copies: int = 1,
                 scaled_bias: bool = False):
        super().__init__()
        self.scale, self.base, self.copies, self.scaled_bias = float(scale), float(base), copies, scaled_bias
        self.weight = nn.Parameter(torch.empty(out_dim, in_dim))  # A
        self.bias = nn.Parameter(torch.empty(out_dim)) if bias else None

    def identity(self, like: torch.Tensor) -> torch.Tensor:
        out_dim, in_dim = self.weight.shape
        eye = torch.eye(out_dim // self.copies, in_dim, dtype=like.dtype, device=like.device)
        return eye.repeat(self.copies, 1)

    def effective_weight(self) -> torch.Tensor:
        weight = self.scale * self.weight
        return weight + self.base * self.identity(weight) if self.base else weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`A (scale x) + base (I x) + b` (`b = scale c` for a scaled bias): elementwise work on x's
        rows, not on a d x d weight and identity rebuilt per call (which a one-position generation
        step notices). The scale goes on x before the product: `A` is `(W - base I) / scale`, so
        `A x` is up to `1 / scale` times larger than `W x` and overflows fp16 (65504) on states that
        `W x` holds (a final norm's output in the thousands), where `A (scale x)` stays within
        `W x`'s range."""
        if self.scale == 1.0:
            out = F.linear(x, self.weight, self.bias if self.scaled_bias else None)
        else:
            inner_bias = self.bias * self.scale if self.scaled_bias else None
            out = F.linear(x * self.scale, self.weight, inner_bias)
        if self.base:
            d = self.weight.shape[0] // self.copies
            identity = x[..., :d] if d <= x.shape[-1] else F.pad(x, (0, d - x.shape[-1]))
            out = (out.unflatten(-1, (self.copies, d)) + self.base * identity.unsqueeze(-2)).flatten(-2)
        return out if self.bias is None or self.scaled_bias else out + self.bias

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
        self.weight.copy_((weight - self.base * self.identity(weight)) / self.scale)
