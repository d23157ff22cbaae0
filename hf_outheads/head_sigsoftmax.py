"""`sigsoftmax`: an untied output layer whose softmax is replaced by sigsoftmax (Kanai, Fujiwara,
Yamanaka, Adachi 2018, "Sigsoftmax: Reanalysis of the Softmax Bottleneck", Eq. 8):

    p(y|h) = exp(z_y) sigma(z_y) / sum_v exp(z_v) sigma(z_v),   z = W h + b

The log of a softmax is a linear function of `h` up to a per-position constant, so its
log-probabilities over `|V|` words span at most `d + 1` dimensions (Yang et al. 2018's softmax
bottleneck); `z + log sigma(z)` is non-linear in `z`, so sigsoftmax's are not bounded by `d`,
at the cost of a single softmax (one element-wise `log sigma` per score).

`logits` are the scores `z + log sigma(z)` (fp32): `softmax(logits)` is sigsoftmax, so
generate's sampling, beam search and the HF loss need nothing else. The training losses:
"full" (the logits and cross-entropy) and "chunked" (the exact loss over row chunks, each
checkpointed, so at most one chunk's `rows x |V|` scores exist at a time; recomputed in
backward); "sampled" is not offered (sampled softmax's correction assumes a softmax).

Conversion from a trained LM head copies `W` and `b`: approximate (sigsoftmax of the same
scores is not their softmax), and no plain LM head computes it, so it has no plain export.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .head_interface import IGNORE_INDEX, HeadInputs, HeadOutput, nll_sum_from_logits
from .head_linear import LinearHead, LinearOptions
from .losses import default_chunk_rows
from .mixture import over_row_chunks
from .options import choice


def sigsoftmax_scores(z: torch.Tensor) -> torch.Tensor:
    """`log(exp(z) sigma(z)) = z + log sigma(z)` in fp32: their softmax is sigsoftmax."""
    z = z.float()
    return z + F.logsigmoid(z)


def _rows_nll(x, labels, weight, bias):
    """Per-row NLL `(rows, 1)` (0 where ignored) of one chunk of rows."""
    scores = sigsoftmax_scores(F.linear(x, weight, bias))
    return F.cross_entropy(scores, labels, ignore_index=IGNORE_INDEX, reduction="none").unsqueeze(-1)


def chunked_sigsoftmax_nll(x, weight, bias, labels) -> torch.Tensor:
    """Summed NLL of `labels` over row chunks of `x (..., d)` (`mixture.over_row_chunks`: each
    chunk checkpointed under autograd, its scores recomputed in backward; one call when traced)."""
    x, labels = x.reshape(-1, x.shape[-1]), labels.reshape(-1)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    rows = default_chunk_rows(weight.shape[0])
    return over_row_chunks(_rows_nll, (x, labels), (weight, bias), rows, grad, 1).sum()


@dataclass
class SigSoftmaxOptions(LinearOptions):
    """training_loss: "full" or "chunked" (sampled softmax's correction assumes a softmax)."""

    head_type: ClassVar[str] = "sigsoftmax"

    training_loss: str = choice("full", ("full", "chunked"))


class SigSoftmaxHead(LinearHead):
    """`W` (`|V| x d_h`, N(0, 0.02^2)) and `b` as `linear`; sigsoftmax over `z = W h + b`."""

    head_type = "sigsoftmax"
    Options = SigSoftmaxOptions

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        chunked = self.training and self.options.training_loss == "chunked"
        if inputs.return_logits is not None:
            chunked = not inputs.return_logits
        if labels is not None and chunked:
            return HeadOutput(nll_sum=chunked_sigsoftmax_nll(inputs.hidden, self.weight, self.bias, labels))
        logits = sigsoftmax_scores(F.linear(inputs.hidden, self.weight, self.bias))
        return HeadOutput(logits=logits, nll_sum=nll_sum_from_logits(logits, labels) if labels is not None else None)

    def plain_lm_head(self, embeddings):
        return None  # not a softmax: no other head starts from it

    def equivalent_lm_head(self, embeddings):
        raise ValueError("Head 'sigsoftmax': exp(z) sigma(z) normalised is not the softmax of an affine map of h, so "
                         "no plain LM head computes it. Serve it with hf_outheads.")

    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """`W`, `b` copied: approximate (returns False)."""
        super().init_from_lm_head(weight, bias, embeddings)
        return False
