"""What `mos` and `doc` share: `p(y|h) = sum_j pi_j(h) softmax(s_j)` with `pi = softmax(W_pi h)`,
`s_j = E k_j + b` (or `W k_j + b`), latents `k_j = act(W_n h^n + b_n)` (DOC paper Eq. 7-11,
Yang et al. 2018 Sec. 3.3). `doc` with every component on the last layer is `mos`: same
parameters (same names), same computation.

Numerics (shared/design/heads.md): mixed in log space in fp32,
`log p(y) = logsumexp_j(log pi_j + log_softmax(s_j)[y])`, and `logits` holds these normalised
log-probabilities. The reference codes mix probabilities and take `log(p + 1e-8)`; we do not.
The training loss never builds `N x J x |V|`: it is `-logsumexp_j(log pi_j - nll_j)` with
`nll_j` from `losses.linear_cross_entropy` over the `J * N` latent rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import initialization as init

from .heads import (IGNORE_INDEX, HeadDims, HeadInputs, HeadOptions, HeadOutput, OutputHead, check_choice,
                    check_probability, nll_sum_from_logits)
from .losses import linear_cross_entropy

ACTIVATIONS = ("tanh", "identity")
LATENT_INITS = ("identity", "uniform")
IDENTITY_INIT_STD = 0.02  # noise on `W_n = I` that lets identical components drift apart
DROPOUT_KINDS = ("locked", "standard")
MIX_CHUNK_ELEMENTS = 2**24  # per chunk of the `rows x J x |V|` scores when full log-probs are needed


def check_int(head_type: str, minimum: int, **values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"Head '{head_type}': option '{name}' must be an integer >= {minimum}, got {value!r}.")


@dataclass
class MixtureOptions(HeadOptions):
    """Options both mixtures share (defaults: the reference codes, except the dropout rate)."""

    latent_dim: int | None = None  # d of the latents k_j; None = the embedding width (needed when tied)
    tied: bool = True  # s_j = E k_j + b (reference `tie_weights`); False: own |V| x latent_dim matrix W
    latent_activation: str = "tanh"  # "tanh" (MoS, reference codes) or "identity" (DOC paper Eq. 11 as printed)
    latent_dropout: float = 0.0  # rate on the latents; MoS PTB 0.29, DOC 0.6 (see the heads' docstrings)
    dropout_kind: str = "locked"  # "locked": one mask per sequence reused at every time step; "standard"
    latent_init: str = "uniform"  # "uniform": reference init; "identity": W_n = I + noise, b_n = 0, uniform prior

    def check_mixture(self, head_type: str, dims: HeadDims) -> None:
        if self.latent_dim is not None:
            check_int(head_type, 1, latent_dim=self.latent_dim)
        if not isinstance(self.tied, bool):
            raise ValueError(f"Head '{head_type}': option 'tied' must be true or false, got {self.tied!r}.")
        if self.tied and self.latent_dim not in (None, dims.embed_dim):
            raise ValueError(
                f"Head '{head_type}' with tied=True scores E k_j, so latent_dim must equal the embedding width "
                f"d={dims.embed_dim} (got {self.latent_dim}). Use tied=False for another latent size."
            )
        check_choice(head_type, "latent_activation", self.latent_activation, ACTIVATIONS)
        check_probability(head_type, latent_dropout=self.latent_dropout)
        check_choice(head_type, "dropout_kind", self.dropout_kind, DROPOUT_KINDS)
        check_choice(head_type, "latent_init", self.latent_init, LATENT_INITS)


def _mix(log_prior: torch.Tensor, latents: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    scores = F.linear(latents, weight, bias).log_softmax(-1)  # (rows, J, |V|)
    return torch.logsumexp(scores + log_prior.unsqueeze(-1), dim=-2)


def is_traced() -> bool:
    """Inside `torch.export` / `torch.compile` tracing, where a Python loop over a tensor size
    would freeze that size into the graph."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def over_row_chunks(fn, row_args, other_args, rows: int, grad: bool, width: int) -> torch.Tensor:
    """`fn(*row_args, *other_args)` -> `(n, width)`, over chunks of `rows` rows of `row_args`
    (None passes through), checkpointed under autograd, so at most one chunk's intermediates
    exist at a time. Traced (torch.export, torch.compile): one call over all rows, so the
    graph holds for every batch and sequence size."""
    if is_traced():
        return fn(*row_args, *other_args)
    n = next(t for t in row_args if t is not None).shape[0]
    pieces = []
    for start in range(0, n, rows):
        args = [t if t is None else t[start : start + rows] for t in row_args] + list(other_args)
        pieces.append(checkpoint(fn, *args, use_reentrant=False) if grad and n > rows else fn(*args))
    return torch.cat(pieces) if pieces else other_args[0].new_zeros(0, width, dtype=torch.float32)


def mixture_log_probs(log_prior, latents, weight, bias) -> torch.Tensor:
    """Full `log p(.|h)`, `(..., |V|)` fp32, from `log_prior (..., J)` and `latents (..., J, d)`.
    Rows are processed in chunks (`over_row_chunks`: checkpointed under autograd, one call when
    exported), so at most one chunk of `rows x J x |V|` scores exists at a time."""
    lead, (J, d), V = log_prior.shape[:-1], latents.shape[-2:], weight.shape[0]
    log_prior, latents = log_prior.reshape(-1, J).float(), latents.reshape(-1, J, d).float()
    weight, bias = weight.float(), bias.float()
    rows = max(1, MIX_CHUNK_ELEMENTS // (J * V))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (log_prior, latents, weight, bias))
    return over_row_chunks(_mix, (log_prior, latents), (weight, bias), rows, grad, V).reshape(*lead, V)  # (..., 0, V) if empty


def mixture_nll(log_prior, latents, weight, bias, labels) -> torch.Tensor:
    """Exact per-position NLL `-logsumexp_j(log pi_j - nll_j)` of the non-ignored labels (1-D,
    one entry per label != -100), without the `N x J x |V|` tensor."""
    J, d = latents.shape[-2:]
    labels = labels.reshape(-1)
    keep = labels != IGNORE_INDEX
    log_prior, latents, labels = log_prior.reshape(-1, J)[keep], latents.reshape(-1, J, d)[keep], labels[keep]
    nll = linear_cross_entropy(latents.reshape(-1, d), weight, labels.repeat_interleave(J), bias).view(-1, J)
    return -torch.logsumexp(log_prior.float() - nll, dim=-1)


class MixtureHead(OutputHead):
    """Base of `mos` / `doc`. `groups` lists (backbone layer, component count); layer
    `dims.num_layers` means `inputs.hidden`, the state every head reads (final norm and
    `hidden_scale` applied). Parameters: `prior` (W_pi, no bias), `latents[g]` (W_n, b_n of
    group g, all its components in one Linear), `weight` (untied only) and `bias` (b, shared)."""

    returns_log_probs = True
    shared_dropout_mask = False  # doc: one locked mask for all components; mos: one per component
    tanh_init_scale = 0.01  # eps of the tanh conversion (see init_from_lm_head)

    def __init__(self, options: MixtureOptions, dims: HeadDims, groups: list[tuple[int, int]]):
        super().__init__(options, dims)
        self.groups = tuple((int(layer), int(count)) for layer, count in groups)
        self.latent_size = options.latent_dim or dims.embed_dim
        self.num_components = sum(count for _, count in self.groups)
        self.prior = nn.Linear(dims.hidden_dim, self.num_components, bias=False)
        self.latents = nn.ModuleList(nn.Linear(dims.hidden_dim, c * self.latent_size) for _, c in self.groups)
        self.weight = None if options.tied else nn.Parameter(torch.empty(dims.vocab_size, self.latent_size))
        self.bias = nn.Parameter(torch.empty(dims.vocab_size))

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.groups if layer != self.dims.num_layers}))

    def reset_parameters(self) -> None:
        """`latent_init="uniform"`, the reference init: torch's default Linear init for prior and
        latents, uniform(-0.1, 0.1) for an untied output matrix. `"identity"`: every latent map
        starts at `I + N(0, 0.02^2)` (a component scores about what `tied` scores), latent biases
        and the prior at zero (a uniform prior), an untied `W` at N(0, 0.02^2). Output bias zero."""
        if self.options.latent_init == "identity":
            eye = torch.eye(self.latent_size, self.dims.hidden_dim)
            init.zeros_(self.prior.weight)
            for (_, count), linear in zip(self.groups, self.latents):
                init.normal_(linear.weight, 0.0, IDENTITY_INIT_STD)
                with torch.no_grad():
                    linear.weight.add_(eye.repeat(count, 1).to(linear.weight))
                init.zeros_(linear.bias)
            if self.weight is not None:
                init.normal_(self.weight, 0.0, 0.02)
        else:
            bound = self.dims.hidden_dim**-0.5
            for tensor in [self.prior.weight] + [p for linear in self.latents for p in linear.parameters()]:
                init.uniform_(tensor, -bound, bound)
            if self.weight is not None:
                init.uniform_(self.weight, -0.1, 0.1)
        init.zeros_(self.bias)

    def layer_state(self, inputs: HeadInputs, layer: int) -> torch.Tensor:
        if layer == self.dims.num_layers:
            return inputs.hidden
        if layer not in inputs.layers:
            raise ValueError(f"Head '{self.head_type}' needs hidden_states[{layer}]; pass it in HeadInputs.layers.")
        return inputs.layers[layer]

    def latent_states(self, inputs: HeadInputs) -> torch.Tensor:
        """`k` of every component, `(..., J, d)`, activation and dropout applied."""
        parts = [
            linear(self.layer_state(inputs, layer)).unflatten(-1, (count, self.latent_size))
            for (layer, count), linear in zip(self.groups, self.latents)
        ]
        k = torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]
        k = torch.tanh(k) if self.options.latent_activation == "tanh" else k
        return self.latent_dropout(k)

    def latent_dropout(self, k: torch.Tensor) -> torch.Tensor:
        """Locked: the mask is drawn per sequence (first dim) and shared over time steps,
        `(B, 1, J, d)` for `(B, T, J, d)` latents; `doc` also shares it over components."""
        p = self.options.latent_dropout
        if not self.training or p == 0:
            return k
        if self.options.dropout_kind == "standard":
            return F.dropout(k, p, training=True)
        shape = [k.shape[0]] + [1] * (k.dim() - 3) + [1 if self.shared_dropout_mask else k.shape[-2], k.shape[-1]]
        return k * k.new_empty(shape).bernoulli_(1 - p).div_(1 - p)

    def needs_logits(self, inputs: HeadInputs, labels: torch.Tensor | None) -> bool:
        """Full log-probabilities without labels, when `return_logits` asks, and outside
        training; a training forward with labels gets the exact loss alone."""
        if labels is None:
            return True
        return (not self.training) if inputs.return_logits is None else inputs.return_logits

    def aux_loss(self, log_prior: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        return None

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        """Without labels (generation, scoring): `logits` = log p. With labels in training mode:
        the exact loss only, `logits=None`, unless `inputs.return_logits` is True (model
        forward argument `return_logits`). With labels otherwise (evaluation): both."""
        log_prior = F.log_softmax(self.prior(inputs.hidden).float(), dim=-1)
        latents = self.latent_states(inputs)
        weight = inputs.embeddings if self.weight is None else self.weight
        aux = self.aux_loss(log_prior, labels) if self.training and labels is not None else None
        if self.needs_logits(inputs, labels):
            logits = mixture_log_probs(log_prior, latents, weight, self.bias)
            nll = nll_sum_from_logits(logits, labels) if labels is not None else None
            return HeadOutput(logits=logits, nll_sum=nll, aux_loss=aux)
        nll = mixture_nll(log_prior, latents, weight, self.bias, labels).sum()
        return HeadOutput(logits=None, nll_sum=nll, aux_loss=aux)

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
        if self.weight is None:
            if d == d_h and weight.shape == embeddings.shape and torch.equal(weight, embeddings):
                latent_map = torch.eye(d, dtype=torch.float32, device=weight.device)
            else:
                latent_map, exact = torch.linalg.lstsq(embeddings.float(), weight.float()).solution, False
        elif d >= d_h:  # [weight, 0] [I; 0] = weight
            latent_map = torch.eye(d, d_h, dtype=torch.float32, device=weight.device)
            self.weight.zero_()[:, :d_h].copy_(weight)
        else:
            u, s, vh = torch.linalg.svd(weight.float(), full_matrices=False)
            latent_map, exact = vh[:d], False
            self.weight.copy_(u[:, :d] * s[:d])
        if self.options.latent_activation == "tanh":
            latent_map = latent_map * self.tanh_init_scale
            if self.weight is not None:
                self.weight.div_(self.tanh_init_scale)
        for (layer, count), linear in zip(self.groups, self.latents):
            linear.bias.zero_()
            if layer == self.dims.num_layers:
                linear.weight.copy_(latent_map.repeat(count, 1))
            else:
                linear.weight.zero_()
                exact = False
        return exact
