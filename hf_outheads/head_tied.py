"""`tied`: output layer tied to the input embeddings, `s(h) = E h + b`
(DRILL paper, Eq. 2; Inan et al. 2016, Press & Wolf 2017). Needs `d == d_h`."""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from .heads import HeadDims
from .softmax import SoftmaxHead, SoftmaxOptions


def check_tied_dims(head_type: str, dims: HeadDims) -> None:
    if dims.embed_dim != dims.hidden_dim:
        raise ValueError(
            f"Head '{head_type}' scores E h, so the embedding width d={dims.embed_dim} must equal the "
            f"hidden width d_h={dims.hidden_dim}. Use 'bilinear' or 'linear' for this backbone."
        )


class TiedOptions(SoftmaxOptions):
    def validate(self, dims: HeadDims) -> None:
        check_tied_dims("tied", dims)


class TiedHead(SoftmaxHead):
    """Has no weight matrix of its own: `E` is the backbone's embedding, read at each call."""

    head_type = "tied"
    Options = TiedOptions

    def __init__(self, options: SoftmaxOptions, dims: HeadDims):
        super().__init__(options, dims)
        self.bias = nn.Parameter(torch.empty(dims.vocab_size))

    def reset_parameters(self) -> None:
        init.zeros_(self.bias)

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def plain_lm_head(self, embeddings):
        return embeddings.detach(), self.bias.detach()

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        with torch.no_grad():
            self.bias.copy_(bias)
        return weight.shape == embeddings.shape and torch.equal(weight, embeddings)
