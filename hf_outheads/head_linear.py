"""`linear`: untied output layer `s(h) = W h + b` (DRILL paper, Eq. 1)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from .head_options import HeadDims
from .head_interface import register_head
from .softmax import SoftmaxHead, SoftmaxOptions


class LinearOptions(SoftmaxOptions):
    """`linear`'s options: the single-softmax heads' training-loss options and `output_bias`."""


class OwnOutputMatrix:
    """Mixin of the heads that score `z = W h + b` with a `|V| x d_h` matrix `W` of their own,
    independent of the input embeddings (`linear`, `sigsoftmax`), on top of `OutputBias`:
    `W` is N(0, 0.02^2) from scratch and the original LM head's matrix when converted."""

    @property
    def reads_embeddings(self) -> bool:  # its scores read `W`, never E
        return False

    def build_output_matrix(self, dims: HeadDims) -> None:
        self.weight = nn.Parameter(torch.empty(dims.vocab_size, dims.hidden_dim))

    def reset_parameters(self, std: float = 0.02) -> None:
        init.normal_(self.weight, mean=0.0, std=std)
        self.reset_bias()

    def score_width(self) -> int:
        return self.dims.hidden_dim

    def copy_lm_head(self, weight: torch.Tensor, bias: torch.Tensor) -> bool:
        """`W`, `b` copied from an LM head; False when the bias cannot be kept (`copy_bias`)."""
        with torch.no_grad():
            self.weight.copy_(weight)
        return self.copy_bias(bias)


@register_head
class LinearHead(OwnOutputMatrix, SoftmaxHead):
    """`W` is `|V| x d_h`, independent of the input embeddings (what Llama/Qwen2 ship)."""

    head_type = "linear"
    Options = LinearOptions
    exact_plain_export = exact_conversion = True

    def __init__(self, options: LinearOptions, dims: HeadDims):
        super().__init__(options, dims)
        self.build_output_matrix(dims)

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.weight

    def plain_lm_head(self, embeddings):
        return self.weight.detach(), self.bias_or_zeros(self.weight)

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        return self.copy_lm_head(weight, bias)
