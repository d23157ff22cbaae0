"""What a head does to its scores `z` before the softmax, as the LM heads of some families do and as
small-model training does today, and the z-loss:

  - a constant scale: `scale * z` (Cohere's `logit_scale`, Granite's `1 / logits_scaling`);
  - a soft cap: `cap * tanh(z / cap)` (Gemma 2, Gemma Team 2024, arXiv 2408.00118, Sec. 2; Gemma 3;
    the GPT-2 speedruns' modded-nanogpt and nanochat), applied after the scale;
  - the z-loss `z_loss * log(Z)^2` per scored token (PaLM, Chowdhery et al. 2022, arXiv 2204.02311,
    Sec. 5), `log Z` the log-normaliser of the transformed scores: a training term beside the NLL.

The scale is folded into the affine map, `scale * (W c + b) = W (scale c) + scale b`
(`scaled_affine`), so that every loss path (the logits, the fused kernels, the peers' kernels, the
sampled softmax) sees plain scores of a scaled context; the cap is `softcap` on the scores, or the
same formula inside the fused kernels. A mixture (`mos`, `doc`) applies both to each component's
scores before that component's softmax: converted from a backbone whose head transforms its scores,
components that equal the original head then still mix to exactly its distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .head_interface import IGNORE_INDEX
from .head_options import HeadDims, HeadOptions, number


@dataclass
class LogitTransformOptions(HeadOptions):
    """The scores' scale and soft cap. Left unset (None), both take the backbone family's values
    (`HeadDims`, `backbones.LOGIT_TRANSFORMS`), so that the head computes what the family's own LM
    head computes."""

    logit_scale: float | None = number(None, 0.0, open_low=True, optional=True, help=(
        "factor on the scores; unset: the backbone family's (Cohere's logit_scale, ...; 1 elsewhere)"))
    logit_softcap: float | None = number(None, 0.0, optional=True, help=(
        "c of c tanh(s / c) on the scaled scores, 0 for none; unset: the backbone family's (Gemma 2/3's "
        "final_logit_softcapping, ...; 0 elsewhere)"))
    saved_defaults: ClassVar[dict] = {"logit_scale": 1.0, "logit_softcap": 0.0}  # configs saved before the options

    def backbone_defaults(self, dims: HeadDims) -> dict[str, Any]:
        return {"logit_scale": dims.logit_scale, "logit_softcap": dims.logit_softcap}


def logit_transform(options) -> tuple[float, float]:
    """`(scale, cap)` of resolved options; `(1.0, 0.0)` for options without the fields."""
    return getattr(options, "logit_scale", None) or 1.0, getattr(options, "logit_softcap", None) or 0.0


def scaled_affine(x: torch.Tensor, bias: torch.Tensor | None, scale: float):
    """`(scale * x, scale * bias)`: the inputs of `W x + b` whose scores are `scale` times those of
    `x`, `bias` (as they are when `scale` is 1)."""
    if scale == 1.0:
        return x, bias
    return x * scale, None if bias is None else bias * scale


def softcap(scores: torch.Tensor, cap: float) -> torch.Tensor:
    """`cap * tanh(scores / cap)` (as Gemma 2's `Gemma2ForCausalLM.forward`), `scores` as they are for cap 0."""
    return scores if not cap else torch.tanh(scores / cap) * cap


def z_loss_sum(scores: torch.Tensor, labels: torch.Tensor, coefficient: float) -> torch.Tensor:
    """`coefficient * sum log(Z)^2` (fp32) over the rows of `scores (..., |V|)` whose label is kept."""
    lse = scores.float().logsumexp(-1)
    return coefficient * torch.where(labels != IGNORE_INDEX, lse.square(), 0).sum()
