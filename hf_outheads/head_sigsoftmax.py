"""`sigsoftmax`: an untied output layer whose softmax is replaced by sigsoftmax (Kanai, Fujiwara,
Yamanaka, Adachi 2018, "Sigsoftmax: Reanalysis of the Softmax Bottleneck", Eq. 8):

    p(y|h) = exp(z_y) sigma(z_y) / sum_v exp(z_v) sigma(z_v),   z = W h + b

The log of a softmax is a linear function of `h` up to a per-position constant, so its
log-probabilities over `|V|` words span at most `d + 1` dimensions (Yang et al. 2018's softmax
bottleneck); `z + log sigma(z)` is non-linear in `z`, so sigsoftmax's are not bounded by `d`,
at the cost of a single softmax (one element-wise `log sigma` per score).

`logits` are the scores `z + log sigma(z)` (fp32): `softmax(logits)` is sigsoftmax, so
generate's sampling, beam search and the HF loss need nothing else. The training losses:
"full" (the logits and cross-entropy), "chunked" (the exact loss and its gradient in one pass
over row chunks, `losses.mixture_nll_sum` with one sigsoftmax component: at most one chunk's
`rows x |V|` scores exist at a time, the `log sigma` computed inside the chunk (on a GPU inside
the Triton kernels, `softmax_kernels`), nothing recomputed in backward) and "auto" (the default:
"chunked" on a CUDA device, "full" elsewhere); "sampled" is not offered (sampled softmax's
correction assumes a softmax).

What it shares with `linear` (its own `W`, the bias `b`, their init and conversion) it composes
from `OwnOutputMatrix` and `OutputBias`; it is not a `linear` head (no plain export, no other
head converts from it).

Conversion from a trained LM head copies `W` and `b`: approximate (sigsoftmax of the same
scores is not their softmax), and no plain LM head computes it, so it has no plain export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .head_interface import (HeadInputs, HeadOutput, OutputBias, OutputHead, Paper, nll_sum_from_logits, register_head,
                             training_mode, word_rows)
from .head_linear import OwnOutputMatrix
from .losses import mixture_nll_sum
from .head_options import HeadDims, HeadOptions, choice, flag


def sigsoftmax_scores(z: torch.Tensor) -> torch.Tensor:
    """`log(exp(z) sigma(z)) = z + log sigma(z)` in fp32: their softmax is sigsoftmax."""
    z = z.float()
    return z + F.logsigmoid(z)


def chunked_sigsoftmax_nll(x, weight, bias, labels) -> torch.Tensor:
    """Summed NLL of `labels` (fp32 scalar) for `x (..., d)`: the fused chunked loss
    (`losses.mixture_nll_sum`) with one sigsoftmax component, gradient computed in its forward."""
    x, labels = x.reshape(-1, x.shape[-1]), labels.reshape(-1)
    zeros = x.new_zeros(x.shape[0], 1, dtype=torch.float32)
    return mixture_nll_sum(zeros, x.unsqueeze(1), weight, bias, labels, sigsoftmax=True)


@dataclass
class SigSoftmaxOptions(HeadOptions):
    """The training loss without 'sampled' (sampled softmax's correction assumes a softmax) and
    without a kernel choice (no peer kernel computes sigsoftmax)."""

    # configs saved while these options inherited `linear`'s: the sampled loss's options, never read
    retired_options: ClassVar[tuple[str, ...]] = ("sampled_fraction", "sampled_proposal")

    training_loss: str = choice("auto", ("auto", "full", "chunked"), help=(
        "'full': logits and cross-entropy; 'chunked': the exact loss without N x |V| logits (the package's fused "
        "loss); 'auto': 'chunked' on a CUDA device, 'full' elsewhere"))
    output_bias: bool = flag(True, help="learn a per-word output bias b")


@register_head
class SigSoftmaxHead(OwnOutputMatrix, OutputBias, OutputHead):
    """`W` (`|V| x d_h`, N(0, 0.02^2)) and `b` as `linear`; sigsoftmax over `z = W h + b`."""

    head_type = "sigsoftmax"
    Options = SigSoftmaxOptions
    papers = (Paper("Sigsoftmax: Reanalysis of the Softmax Bottleneck", "https://arxiv.org/abs/1805.10829", """\
@inproceedings{kanai2018sigsoftmax,
  title = {Sigsoftmax: Reanalysis of the Softmax Bottleneck},
  author = {Kanai, Sekitoshi and Fujiwara, Yasuhiro and Yamanaka, Yuki and Adachi, Shuichi},
  booktitle = {Advances in Neural Information Processing Systems},
  volume = {31},
  year = {2018}
}""", arxiv="1805.10829"),)
    benchmark_options = {"": {}, "chunked": {"training_loss": "chunked"}}
    single_softmax = True
    plain_export_limit = "`softmax(z + log sigmoid(z))` is not a softmax of an affine map of `h`"

    def __init__(self, options: SigSoftmaxOptions, dims: HeadDims):
        super().__init__(options, dims)
        self.build_output_bias()
        self.build_output_matrix(dims)

    def forward_flops(self, num_positions: int) -> int:
        return num_positions * 2 * self.dims.hidden_dim * self.dims.vocab_size

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        if labels is not None and training_mode(self.options.training_loss, self.training, inputs.hidden.device,
                                                   inputs.return_logits) == "chunked":
            return HeadOutput(nll_sum=chunked_sigsoftmax_nll(inputs.hidden, self.weight, self.bias, labels))
        logits = sigsoftmax_scores(F.linear(inputs.hidden, self.weight, self.bias))
        return HeadOutput(logits=logits, nll_sum=nll_sum_from_logits(logits, labels) if labels is not None else None)

    def word_scorer(self, embeddings: torch.Tensor, rows: torch.Tensor | None = None):
        """`h -> z + log sigmoid(z)`, `z = W[rows] h + b[rows]`: `forward`'s logits at the columns `rows`."""
        weight, bias = word_rows(self.weight, self.bias, rows)
        return lambda hidden: sigsoftmax_scores(F.linear(hidden, weight, bias))

    def loss_path(self, device: torch.device) -> str:
        mode = training_mode(self.options.training_loss, True, device)
        return super().loss_path(device) if mode == "chunked" else mode

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """`W`, `b` copied: approximate (returns False)."""
        self.copy_lm_head(weight, bias)
        return False
