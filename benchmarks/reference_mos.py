"""The published MoS code's computation (zihangdai/mos, `model.py`), as a benchmark baseline:
all `N x K x |V|` component probabilities are materialised, mixed in probability space and
logged with `log(p + 1e-8)`. Same parameters as the package's `mos` head."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from hf_outheads.head_interface import IGNORE_INDEX, HeadOutput

COMPARED = {"mos-reference": "mos"}  # the benchmark's case -> the package's case whose options and step it takes


def reference_forward(self, inputs, labels=None):
    prior = F.softmax(self.prior(inputs.hidden), dim=-1)  # (B, T, K)
    latents = self.latent_states(inputs)  # (B, T, K, d)
    weight = inputs.embeddings if self.weight is None else self.weight
    probs = F.softmax(F.linear(latents, weight, self.bias), dim=-1)  # (B, T, K, |V|)
    log_probs = torch.log((prior.unsqueeze(-1) * probs).sum(-2) + 1e-8)
    nll = None
    if labels is not None:
        nll = F.nll_loss(log_probs.reshape(-1, log_probs.shape[-1]), labels.reshape(-1),
                         ignore_index=IGNORE_INDEX, reduction="sum")
    return HeadOutput(logits=log_probs, nll_sum=nll)


def use_reference_mos(head) -> None:
    head.forward = types.MethodType(reference_forward, head)
