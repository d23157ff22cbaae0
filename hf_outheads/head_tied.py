"""`tied`: output layer tied to the input embeddings, `s(h) = E h + b`
(DRILL paper, Eq. 2; Inan et al. 2016, Press & Wolf 2017). Needs `d == d_h`."""

from __future__ import annotations

from typing import ClassVar

import torch

from .options import HeadDims, require_tied_width
from .softmax import SoftmaxHead, SoftmaxOptions


class TiedOptions(SoftmaxOptions):
    head_type: ClassVar[str] = "tied"

    def complete(self, dims: HeadDims) -> None:
        require_tied_width("tied", dims, "scores E h", "'bilinear' or 'linear'")


class TiedHead(SoftmaxHead):
    """Has no weight matrix of its own: `E` is the backbone's embedding, read at each call."""

    head_type = "tied"
    Options = TiedOptions

    def reset_parameters(self) -> None:
        self.reset_bias()

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def plain_lm_head(self, embeddings):
        return embeddings.detach(), self.bias_or_zeros(embeddings)

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        exact_bias = self.copy_bias(bias)
        return exact_bias and weight.shape == embeddings.shape and torch.equal(weight, embeddings)
