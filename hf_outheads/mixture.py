"""What `mos` and `doc` share: `p(y|h) = sum_j pi_j(h) softmax(s_j)` with `pi = softmax(W_pi h)`,
`s_j = E k_j + b` (or `W k_j + b`), latents `k_j = act(W_n h^n + b_n)` (DOC paper Eq. 7-11,
Yang et al. 2018 Sec. 3.3). `doc` with every component on the last layer is `mos`: same
parameters (same names), same computation.

Numerics: mixed in log space in fp32,
`log p(y) = logsumexp_j(log pi_j + log_softmax(s_j)[y])`, and `logits` holds these normalised
log-probabilities. The reference codes mix probabilities and take `log(p + 1e-8)`; we do not.
The training loss never builds `N x J x |V|`: `losses.mixture_nll_sum` computes it and its
gradient in one pass over row chunks (nothing recomputed in backward). Generation's few rows
are one batched matmul over the J latents (`mixture_log_probs`).

The scores' scale and soft cap (`logit_transforms`, the backbone family's by default) apply to each
component's scores before its softmax, `softmax(cap tanh(scale s_j / cap))`: it is how the heads the
components stand for compute theirs, and a mixture converted from such a backbone, whose components
all start as the original head, then still gives exactly its distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .head_interface import HeadInputs, HeadOutput, OutputHead, TiedToEmbeddings, nll_sum_from_logits
from .latents import MixtureOptions, PriorAndLatents
from .logit_transforms import LogitTransformOptions, logit_transform, scaled_affine, softcap
from .losses import grad_needed, log_probs_chunk_rows, mixture_nll_sum, over_row_chunks
from .head_options import HeadDims


def _mix(log_prior: torch.Tensor, latents: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, cap: float):
    scores = softcap(F.linear(latents, weight, bias), cap).log_softmax(-1)  # (rows, J, |V|)
    return torch.logsumexp(scores + log_prior.unsqueeze(-1), dim=-2)


@dataclass
class SoftmaxMixtureOptions(MixtureOptions, LogitTransformOptions):
    """The mixtures' options (`MixtureOptions`) and each component's scale and soft cap (`LogitTransformOptions`)."""


def mixture_log_probs(log_prior, latents, weight, bias, cap: float = 0.0) -> torch.Tensor:
    """Full `log p(.|h)`, `(..., |V|)` fp32, from `log_prior (..., J)` and `latents (..., J, d)`, each
    component's scores soft-capped at `cap` (0: none).
    Up to `losses.LOG_PROBS_CHUNK_ELEMENTS` of `rows x J x |V|` scores (generation's last positions): one
    batched matmul over the J latents. More rows: chunks (`over_row_chunks`: checkpointed
    under autograd, one call when traced), so at most one chunk of scores exists at a time."""
    lead, (J, d), V = log_prior.shape[:-1], latents.shape[-2:], weight.shape[0]
    log_prior, latents = log_prior.reshape(-1, J).float(), latents.reshape(-1, J, d).float()
    weight, bias = weight.float(), bias.float()
    grad = grad_needed(log_prior, latents, weight, bias)
    rows = log_probs_chunk_rows(J * V)
    return over_row_chunks(_mix, (log_prior, latents), (weight, bias, cap), rows, grad, V).reshape(*lead, V)  # (..., 0, V) if empty


class MixtureHead(TiedToEmbeddings, PriorAndLatents, OutputHead):
    """Base of `mos` / `doc`: `PriorAndLatents` (groups from `component_groups`), `weight`
    (W, a parameter when untied; with `tied=True` it is `E`, shown by `TiedToEmbeddings`) and
    `bias` (b, shared by the components)."""

    returns_log_probs = True
    plain_export_limit = "a mixture of softmaxes is not one softmax"

    def __init__(self, options: MixtureOptions, dims: HeadDims):
        super().__init__(options, dims)
        self.build_prior_and_latents(self.component_groups(), self.options.latent_dim or dims.embed_dim)
        if not self.options.tied:
            self.weight = nn.Parameter(torch.empty(dims.vocab_size, self.latent_size))
        self.bias = nn.Parameter(torch.empty(dims.vocab_size))

    @property
    def reads_embeddings(self) -> bool:  # `TiedToEmbeddings`: E is W
        return self.options.tied

    def component_groups(self) -> list[tuple[int, int]]:
        """(backbone layer, component count) pairs, from the resolved `self.options`."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """`latent_init` for prior and latents (`init_prior_and_latents`); an untied `W`:
        N(0, 0.02^2) with "identity", uniform(-0.1, 0.1) (reference) otherwise. Output bias zero."""
        identity = self.options.latent_init == "identity"
        self.init_prior_and_latents(identity)
        if not self.options.tied:
            if identity:
                init.normal_(self.weight, 0.0, 0.02)
            else:
                init.uniform_(self.weight, -0.1, 0.1)
        init.zeros_(self.bias)

    def aux_loss(self, log_prior: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        return None

    def forward_flops(self, num_positions: int) -> int:
        """Per position: the J latents and the prior from `d_h`, and J scores over `|V|`."""
        J, d, d_h, V = self.total_components, self.latent_size, self.dims.hidden_dim, self.dims.vocab_size
        return num_positions * (2 * d_h * J * d + 2 * d_h * J + 2 * J * d * V)

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        """Without labels (generation, scoring): `logits` = log p. With labels in training mode:
        the exact loss only, `logits=None`, unless `inputs.return_logits` is True (model
        forward argument `return_logits`). With labels otherwise (evaluation): both."""
        log_prior = self.log_prior(inputs.hidden)
        scale, cap = logit_transform(self.options)
        latents, bias = scaled_affine(self.latent_states(inputs), self.bias, scale)  # scale (W k_j + b)
        weight = inputs.embeddings if self.options.tied else self.weight
        aux = self.aux_loss(log_prior, labels) if self.training and labels is not None else None
        if self.needs_logits(inputs, labels):
            logits = mixture_log_probs(log_prior, latents, weight, bias, cap)
            nll = nll_sum_from_logits(logits, labels) if labels is not None else None
            return HeadOutput(logits=logits, nll_sum=nll, aux_loss=aux)
        nll = mixture_nll_sum(log_prior, latents, weight, bias, labels, softcap=cap)
        return HeadOutput(logits=None, nll_sum=nll, aux_loss=aux)

    def logit_transform(self) -> tuple[float, float]:
        return logit_transform(self.options)

    @torch.no_grad()
    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """Every last-layer component becomes the original head (`W_out A = weight`, latent bias
        0); identical components mix to exactly that softmax whatever the prior, so the prior
        gets the reference random init, which makes the components' gradients differ (a zero
        prior would keep them identical forever). Exact (returns True) only with `latent_activation="identity"`,
        no middle-layer components, and either `tied=False` with `latent_dim >= d_h` or `tied=True`
        on a tied original with `d == d_h`. Otherwise approximate (returns False):
          - `tied=True` on an untied original (or d != d_h): `A` is the least-squares fit of E A = weight;
          - `tied=False`, `latent_dim < d_h`: best rank-`latent_dim` factorisation (truncated SVD);
          - tanh: `tanh(eps A h) / eps = A h + O(eps^2 |A h|^3)`, eps = `tanh_init_scale`; the `1/eps`
            goes into an untied `W`; tied components cannot rescale `E`, so `E tanh(A h)` differs a lot;
          - a middle-layer (doc) component starts with zero latent weights: it predicts
            `softmax(b)` and takes its prior's share of the mass.
        """
        d, d_h = self.latent_size, self.dims.hidden_dim
        exact = self.options.latent_activation == "identity"
        self.bias.copy_(bias)
        bound = d_h**-0.5  # a random prior whatever `latent_init` (identity's is uniform: zero)
        self.prior.weight.uniform_(-bound, bound)
        if self.options.tied:
            if d == d_h and weight.shape == embeddings.shape and torch.equal(weight, embeddings):
                latent_map = torch.eye(d, dtype=torch.float64, device=weight.device)
            else:
                latent_map, exact = torch.linalg.lstsq(embeddings.double(), weight.double()).solution, False
        elif d >= d_h:  # [weight, 0] [I; 0] = weight
            latent_map = torch.eye(d, d_h, dtype=torch.float64, device=weight.device)
            self.weight.zero_()[:, :d_h].copy_(weight)
        else:
            u, s, vh = torch.linalg.svd(weight.double(), full_matrices=False)  # float64: float32 LAPACK varies between runs
            latent_map, exact = vh[:d], False
            self.weight.copy_(u[:, :d] * s[:d])
        latent_map = latent_map * self.conversion_scale
        if not self.options.tied:
            self.weight.div_(self.conversion_scale)
        for group, ((layer, count), linear) in enumerate(zip(self.groups, self.latents)):
            linear.bias.zero_()
            top = layer == self.dims.num_layers
            self.set_latent_map(group, latent_map.repeat(count, 1) if top else torch.zeros_like(linear.weight))
            exact = exact and top
        return exact
