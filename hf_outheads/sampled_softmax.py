"""Sampled softmax over a batch-shared candidate set (joint input-output embedding paper,
Pappas et al. 2018, Sec. 3.2): the candidates are every distinct target of the batch plus
negatives sampled from the rest of the vocabulary until they make up `fraction` of it; only
their scores are computed and updated. Used in training only; evaluation and generation
use the full softmax.

Departure from the reference code (uniform negatives, no correction): each candidate's
score is corrected by `-log q_c`, `q_c` its probability of being in the set (1 for the
batch's targets), so that the candidates' `sum exp(s_c) / q_c` is an importance-sampling
estimate of the full partition function; with a unigram proposal this is the log-Q
correction of Jean et al. (2015). Accidental hits cannot occur: negatives are drawn from
the words that are not targets of the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .head_interface import IGNORE_INDEX
from .logit_transforms import softcap


def sample_candidates(
    targets: torch.Tensor, vocab_size: int, fraction: float, log_q: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted distinct targets, sampled negatives, log inclusion probability of each negative).

    `log_q`: log proposal over the vocabulary (None = uniform). Uniform negatives are drawn
    without replacement; unigram ones with replacement (then de-duplicated), a word drawn
    `k` times having inclusion probability `1 - (1 - q_w) ** k`.
    """
    positives = torch.unique(targets)
    wanted = max(int(fraction * vocab_size) - positives.numel(), 0)
    pool = torch.ones(vocab_size, dtype=torch.bool, device=targets.device)
    pool[positives] = False
    pool_ids = pool.nonzero().squeeze(1)
    wanted = min(wanted, pool_ids.numel())
    if log_q is None:
        negatives = pool_ids[torch.randperm(pool_ids.numel(), device=targets.device)[:wanted]]
        log_incl = torch.full((negatives.numel(),), wanted / max(pool_ids.numel(), 1), device=targets.device).log()
    else:
        q = log_q[pool_ids].float().softmax(0)  # renormalised over the pool
        draws = torch.multinomial(q, wanted, replacement=True) if wanted else q.new_zeros(0, dtype=torch.long)
        picked = torch.unique(draws)
        negatives = pool_ids[picked]
        log_incl = torch.log(-torch.expm1(wanted * torch.log1p(-q[picked].clamp(max=1 - 1e-7))))
    return positives, negatives, log_incl.float()


def sampled_nll_sum(
    context: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    fraction: float,
    log_q: torch.Tensor | None = None,
    cap: float = 0.0,
) -> torch.Tensor:
    """Summed NLL of the non-ignored labels under the sampled softmax (fp32), of the candidates'
    scores soft-capped at `cap` (`logit_transforms.softcap`; 0: none) before the correction."""
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    context, labels = context.reshape(-1, context.shape[-1])[keep], labels[keep]
    if labels.numel() == 0:
        return context.sum() * 0.0
    positives, negatives, log_incl = sample_candidates(labels, weight.shape[0], fraction, log_q)
    candidates = torch.cat([positives, negatives])
    scores = F.linear(context.float(), weight[candidates].float(), None if bias is None else bias[candidates].float())
    scores = softcap(scores, cap)
    correction = torch.cat([log_incl.new_zeros(positives.shape), log_incl])  # targets are in with certainty
    return F.cross_entropy(scores - correction, torch.searchsorted(positives, labels), reduction="sum")
