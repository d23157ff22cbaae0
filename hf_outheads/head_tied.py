"""`tied`: output layer tied to the input embeddings, `s(h) = E h + b`
(DRILL paper, Eq. 2; Inan et al. 2016, Press & Wolf 2017). Needs `d == d_h`."""

from __future__ import annotations

import torch

from .head_options import HeadDims, require_tied_width
from .head_interface import Paper, TiedToEmbeddings, register_head
from .softmax import SoftmaxHead, SoftmaxOptions


class TiedOptions(SoftmaxOptions):
    def complete(self, dims: HeadDims) -> None:
        super().complete(dims)
        require_tied_width(self.head_type, dims, "scores E h", "'bilinear' or 'linear'")


@register_head
class TiedHead(TiedToEmbeddings, SoftmaxHead):
    """Has no weight matrix of its own: `E` is the backbone's embedding, read at each call."""

    head_type = "tied"
    Options = TiedOptions
    papers = (
        Paper("Using the Output Embedding to Improve Language Models", "https://aclanthology.org/E17-2025", """\
@inproceedings{press-wolf-2017-using,
  title = {Using the Output Embedding to Improve Language Models},
  author = {Press, Ofir and Wolf, Lior},
  booktitle = {Proceedings of the 15th Conference of the European Chapter of the Association for Computational Linguistics: Volume 2, Short Papers},
  year = {2017},
  pages = {157--163}
}""", arxiv="1608.05859"),
        Paper("Tying Word Vectors and Word Classifiers: A Loss Framework for Language Modeling",
              "https://arxiv.org/abs/1611.01462", """\
@inproceedings{inan2017tying,
  title = {Tying Word Vectors and Word Classifiers: A Loss Framework for Language Modeling},
  author = {Inan, Hakan and Khosravi, Khashayar and Socher, Richard},
  booktitle = {International Conference on Learning Representations},
  year = {2017}
}""", arxiv="1611.01462"),
    )
    exact_plain_export = exact_conversion = True
    # chunked: the exact loss without N x |V| logits (the fastest kernel installed); own: the package's kernels
    benchmark_options = {"": {}, "chunked": {"training_loss": "chunked"},
                         "own": {"training_loss": "chunked", "loss_kernel": "own"}}

    def reset_parameters(self) -> None:
        self.reset_bias()

    def label_matrix(self, embeddings: torch.Tensor) -> torch.Tensor:
        return embeddings

    def plain_lm_head(self, embeddings):
        return embeddings.detach(), self.bias_or_zeros(embeddings)

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        exact_bias = self.copy_bias(bias)
        return exact_bias and weight.shape == embeddings.shape and torch.equal(weight, embeddings)
