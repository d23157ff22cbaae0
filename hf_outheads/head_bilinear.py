"""`bilinear`: `s(h) = E W_l h + b`, `W_l` is `d x d_h` (DRILL paper, Eq. 3; Gulordava et al. 2018).

Computed as `E (W_l h)`: `N d d_h` per call instead of `|V| d d_h` for `E W_l`.

Option `init` (from scratch): "identity" (default) starts `W_l` at `I` (`tied`'s scores;
a `d x d_h` semi-identity when d != d_h); "uniform" is the DRILL
reference init, uniform(-0.1, 0.1), which starts from a random projection of `h` (departure:
measured worse on transformer backbones, see training/results).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from transformers import initialization as init

from .options import HeadDims, choice
from .softmax import SoftmaxHead, SoftmaxOptions

INITS = ("identity", "uniform")


@dataclass
class BilinearOptions(SoftmaxOptions):
    """init: "identity" (`W_l = I`: starts as `tied`) or "uniform" (DRILL reference)."""

    head_type: ClassVar[str] = "bilinear"

    init: str = choice("identity", INITS)


class BilinearHead(SoftmaxHead):
    head_type = "bilinear"
    Options = BilinearOptions

    def __init__(self, options: BilinearOptions, dims: HeadDims):
        super().__init__(options, dims)
        self.proj = nn.Linear(dims.hidden_dim, dims.embed_dim, bias=False)  # W_l
        self.bias = nn.Parameter(torch.empty(dims.vocab_size))

    def reset_parameters(self) -> None:
        if self.options.init == "identity":
            init.copy_(self.proj.weight, torch.eye(*self.proj.weight.shape))
        else:
            init.uniform_(self.proj.weight, -0.1, 0.1)  # DRILL reference init
        init.zeros_(self.bias)

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def context(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """`W_l = I` reproduces a tied original exactly. For an untied original (or d != d_h)
        `W_l` is the least-squares fit of `E W_l ~= W` (approximate; returns False)."""
        with torch.no_grad():
            self.bias.copy_(bias)
            if weight.shape == embeddings.shape and torch.equal(weight, embeddings):
                self.proj.weight.copy_(torch.eye(self.dims.embed_dim, dtype=weight.dtype))
                return True
            fit = torch.linalg.lstsq(embeddings.float(), weight.float()).solution  # d x d_h
            self.proj.weight.copy_(fit)
        return False
