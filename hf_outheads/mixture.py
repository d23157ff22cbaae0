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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import initialization as init

from .head_interface import HeadInputs, HeadOutput, OutputHead, nll_sum_from_logits
from .losses import is_traced, mixture_nll_sum
from .options import HeadDims, HeadOptions, choice, flag, integer, number, probability

ACTIVATIONS = ("tanh", "identity")
LATENT_INITS = ("identity", "uniform")
IDENTITY_INIT_STD = 0.02  # noise on `W_n = I` that lets identical components drift apart
DROPOUT_KINDS = ("locked", "standard")
MIX_CHUNK_ELEMENTS = 2**24  # per chunk of the `rows x J x |V|` scores when full log-probs are needed


@dataclass
class MixtureOptions(HeadOptions):
    """Options of the prior and latents (`mos`, `doc`, `lightrnn`). Defaults measured on transformer
    backbones: an own output matrix and identity latents started at the identity under a uniform
    prior, learnt at `map_scale` 0.01 from scratch; the reference codes are `tied=True`,
    `latent_activation="tanh"`, `latent_init="uniform"`, plain maps (and dropout, see the heads)."""

    latent_dim: int | None = integer(None, minimum=1, optional=True)  # d of k_j; None = embedding width
    tied: bool = flag(False)  # own |V| x latent_dim matrix W; True: s_j = E k_j + b (reference `tie_weights`)
    latent_activation: str = choice("identity", ACTIVATIONS)  # "identity" (DOC Eq. 11) or "tanh" (MoS, reference)
    latent_dropout: float = probability(0.0)  # rate on the latents; MoS PTB 0.29, DOC 0.6 (heads' docstrings)
    dropout_kind: str = choice("locked", DROPOUT_KINDS)  # "locked": one mask per sequence for all steps
    latent_init: str = choice("identity", LATENT_INITS)  # "identity": W_n = I + noise; "uniform": reference
    # how far a step of the stored latent parameters moves the latent maps (`PriorAndLatents`);
    # 1: the plain form (None: `scratch_defaults` from scratch, `conversion_defaults` when converted)
    map_scale: float | None = number(None, 0.0, 1.0, open_low=True, optional=True)
    scratch_defaults: ClassVar[dict] = {"map_scale": 0.01}  # measured (the repository's ablations)
    conversion_defaults: ClassVar[dict] = {"map_scale": 1.0}
    saved_defaults: ClassVar[dict] = {"map_scale": 1.0}  # configs saved before the option: plain maps

    def complete(self, dims: HeadDims) -> None:
        if self.tied and self.latent_dim not in (None, dims.embed_dim):
            self.fail(f"with tied=True it scores E k_j, so latent_dim must equal the embedding width "
                      f"d={dims.embed_dim} (got {self.latent_dim}). Use tied=False for another latent size.")


class PriorAndLatents:
    """The prior `pi = softmax(W_pi h)` (no bias) and the component latents `k = act(W_n h^n + b_n)`
    shared by the mixtures and `lightrnn`: a mix-in of `OutputHead` subclasses.
    `build_prior_and_latents` registers `prior` and `latents[g]` (all components of group g in one
    Linear) on the head itself, so their parameter names are `head.prior.*`, `head.latents.{g}.*`
    (a sub-module would rename them and break saved checkpoints). `groups` lists (backbone layer,
    component count); layer `dims.num_layers` means `inputs.hidden` (final norm and `hidden_scale`
    applied). Options read: `latent_activation`, `latent_dropout`, `dropout_kind`, `map_scale`.

    `map_scale` s < 1 stores each latent map as `W_n = (1 - s) I + s A_n` and its bias as `s c_n`
    (`I` only with the identity init; 0 with the reference init), so that under Adam-type
    optimisers a step of the stored `A_n, c_n` moves the map s times as far (as `ScaledMap` does
    for `bilinear` and `joint`). s = 1 is the plain `W_n = A_n`, the stored form of earlier
    versions."""

    shared_dropout_mask = False  # doc: one locked mask for all components; mos: one per component
    tanh_init_scale = 0.01  # eps of the tanh conversion (see `MixtureHead.init_from_lm_head`)

    @property
    def conversion_scale(self) -> float:
        """The latent maps' scale in a conversion: eps with tanh latents (`tanh(eps A h) / eps ~ A h`,
        the `1/eps` goes into the output weights), 1 with identity latents."""
        return self.tanh_init_scale if self.options.latent_activation == "tanh" else 1.0

    def build_prior_and_latents(self, groups: list[tuple[int, int]], latent_size: int, with_prior: bool = True):
        """`with_prior=False`: log pi = 0, one component (no parameter without a gradient)."""
        self.groups = tuple((int(layer), int(count)) for layer, count in groups)
        self.latent_size = latent_size
        self.num_components = sum(count for _, count in self.groups)
        hidden_dim = self.dims.hidden_dim
        prior = nn.Linear(hidden_dim, self.num_components, bias=False)  # drawn either way: same seed, same init
        self.prior = prior if with_prior else None
        self.latents = nn.ModuleList(nn.Linear(hidden_dim, c * latent_size) for _, c in self.groups)
        self.dropout = nn.Dropout(self.options.latent_dropout)  # holds the rate: see latent_dropout

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.groups if layer != self.dims.num_layers}))

    @property
    def latent_scale(self) -> float:
        return 1.0 if self.options.map_scale is None else float(self.options.map_scale)

    @property
    def latent_base(self) -> float:
        """The identity's share `1 - s` in the latent maps (0 with the reference init)."""
        return (1.0 - self.latent_scale) if self.options.latent_init == "identity" else 0.0

    def init_prior_and_latents(self, identity: bool) -> None:
        """`identity`: every latent map starts at `I + N(0, 0.02^2)` (a component scores about
        what `tied` scores), latent biases and the prior at zero (a uniform prior). Otherwise the
        reference init: torch's default Linear init, uniform(+-1/sqrt(d_h)), for every parameter.
        The effective maps start the same whatever `map_scale` (the stored values are divided by it)."""
        scale = self.latent_scale
        if identity:
            eye = torch.eye(self.latent_size, self.dims.hidden_dim)
            if self.prior is not None:
                init.zeros_(self.prior.weight)
            for (_, count), linear in zip(self.groups, self.latents):
                init.normal_(linear.weight, 0.0, IDENTITY_INIT_STD / scale)
                with torch.no_grad():
                    linear.weight.add_(eye.repeat(count, 1).to(linear.weight))
                init.zeros_(linear.bias)
            return
        bound = self.dims.hidden_dim**-0.5
        if self.prior is not None:
            init.uniform_(self.prior.weight, -bound, bound)
        for tensor in [p for linear in self.latents for p in linear.parameters()]:
            init.uniform_(tensor, -bound / scale, bound / scale)

    @torch.no_grad()
    def set_latent_map(self, group: int, weight: torch.Tensor) -> None:
        """Store group `group`'s latent weights so that its effective maps are `weight`
        (`(count * d, d_h)`, a conversion), whatever `map_scale`."""
        linear, count = self.latents[group], self.groups[group][1]
        eye = torch.eye(self.latent_size, self.dims.hidden_dim, dtype=weight.dtype, device=weight.device)
        linear.weight.copy_((weight - self.latent_base * eye.repeat(count, 1)) / self.latent_scale)

    def latent_map_outputs(self, linear: nn.Linear, x: torch.Tensor, count: int) -> torch.Tensor:
        """`(1 - s) I x + s (A x + c)` for `count` components, `(..., count, d)`."""
        k = linear(x).unflatten(-1, (count, self.latent_size))
        if self.latent_scale == 1.0:
            return k
        k = k * self.latent_scale
        if self.latent_base:
            d = self.latent_size
            identity = x[..., :d] if d <= x.shape[-1] else F.pad(x, (0, d - x.shape[-1]))
            k = k + self.latent_base * identity.unsqueeze(-2)
        return k

    def log_prior(self, hidden: torch.Tensor) -> torch.Tensor:
        """`log pi`, `(..., J)` fp32 (`(..., 1)` zeros without a prior)."""
        if self.prior is None:
            return hidden.new_zeros(*hidden.shape[:-1], 1, dtype=torch.float32)
        return F.log_softmax(self.prior(hidden).float(), dim=-1)

    def layer_state(self, inputs: HeadInputs, layer: int) -> torch.Tensor:
        if layer == self.dims.num_layers:
            return inputs.hidden
        if layer not in inputs.layers:
            raise ValueError(f"Head '{self.head_type}' needs hidden_states[{layer}]; pass it in HeadInputs.layers.")
        return inputs.layers[layer]

    def latent_states(self, inputs: HeadInputs) -> torch.Tensor:
        """`k` of every component, `(..., J, d)`, activation and dropout applied."""
        parts = [
            self.latent_map_outputs(linear, self.layer_state(inputs, layer), count)
            for (layer, count), linear in zip(self.groups, self.latents)
        ]
        k = torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]
        k = torch.tanh(k) if self.options.latent_activation == "tanh" else k
        return self.latent_dropout(k)

    def latent_dropout(self, k: torch.Tensor) -> torch.Tensor:
        """Locked: the mask is drawn per sequence (first dim) and shared over time steps,
        `(B, 1, J, d)` for `(B, T, J, d)` latents; `doc` also shares it over components. The rate
        is `self.dropout.p` (an `nn.Dropout`, no state), so the switches that set every dropout's
        `p` to 0 (TRL's `disable_dropout_in_model`) reach it."""
        p = self.dropout.p
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


def _mix(log_prior: torch.Tensor, latents: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    scores = F.linear(latents, weight, bias).log_softmax(-1)  # (rows, J, |V|)
    return torch.logsumexp(scores + log_prior.unsqueeze(-1), dim=-2)


def over_row_chunks(fn, row_args, other_args, rows: int, grad: bool, width: int) -> torch.Tensor:
    """`fn(*row_args, *other_args)` -> `(n, width)`, over chunks of `rows` rows of `row_args`
    (None passes through), checkpointed under autograd, so at most one chunk's intermediates
    exist at a time; at most `rows` rows: one call, no loop. Traced (torch.export,
    torch.compile): one call over all rows, so the graph holds for every batch and sequence size."""
    if is_traced():
        return fn(*row_args, *other_args)
    n = next(t for t in row_args if t is not None).shape[0]
    if 0 < n <= rows:
        return fn(*row_args, *other_args)
    pieces = []
    for start in range(0, n, rows):
        args = [t if t is None else t[start : start + rows] for t in row_args] + list(other_args)
        pieces.append(checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args))
    return torch.cat(pieces) if pieces else other_args[0].new_zeros(0, width, dtype=torch.float32)


def mixture_log_probs(log_prior, latents, weight, bias) -> torch.Tensor:
    """Full `log p(.|h)`, `(..., |V|)` fp32, from `log_prior (..., J)` and `latents (..., J, d)`.
    Up to `MIX_CHUNK_ELEMENTS` of `rows x J x |V|` scores (generation's last positions): one
    batched matmul over the J latents. More rows: chunks (`over_row_chunks`: checkpointed
    under autograd, one call when traced), so at most one chunk of scores exists at a time."""
    lead, (J, d), V = log_prior.shape[:-1], latents.shape[-2:], weight.shape[0]
    log_prior, latents = log_prior.reshape(-1, J).float(), latents.reshape(-1, J, d).float()
    weight, bias = weight.float(), bias.float()
    rows = max(1, MIX_CHUNK_ELEMENTS // (J * V))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (log_prior, latents, weight, bias))
    return over_row_chunks(_mix, (log_prior, latents), (weight, bias), rows, grad, V).reshape(*lead, V)  # (..., 0, V) if empty


class MixtureHead(PriorAndLatents, OutputHead):
    """Base of `mos` / `doc`: `PriorAndLatents` (groups from `component_groups`), `weight`
    (W, untied only) and `bias` (b, shared by the components)."""

    returns_log_probs = True

    def __init__(self, options: MixtureOptions, dims: HeadDims):
        super().__init__(options, dims)
        self.build_prior_and_latents(self.component_groups(), self.options.latent_dim or dims.embed_dim)
        self.weight = None if self.options.tied else nn.Parameter(torch.empty(dims.vocab_size, self.latent_size))
        self.bias = nn.Parameter(torch.empty(dims.vocab_size))

    def component_groups(self) -> list[tuple[int, int]]:
        """(backbone layer, component count) pairs, from the resolved `self.options`."""
        raise NotImplementedError

    def reset_parameters(self) -> None:
        """`latent_init` for prior and latents (`init_prior_and_latents`); an untied `W`:
        N(0, 0.02^2) with "identity", uniform(-0.1, 0.1) (reference) otherwise. Output bias zero."""
        identity = self.options.latent_init == "identity"
        self.init_prior_and_latents(identity)
        if self.weight is not None:
            if identity:
                init.normal_(self.weight, 0.0, 0.02)
            else:
                init.uniform_(self.weight, -0.1, 0.1)
        init.zeros_(self.bias)

    def aux_loss(self, log_prior: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        return None

    def forward_flops(self, num_positions: int) -> int:
        """Per position: the J latents and the prior from `d_h`, and J scores over `|V|`."""
        J, d, d_h, V = self.num_components, self.latent_size, self.dims.hidden_dim, self.dims.vocab_size
        return num_positions * (2 * d_h * J * d + 2 * d_h * J + 2 * J * d * V)

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        """Without labels (generation, scoring): `logits` = log p. With labels in training mode:
        the exact loss only, `logits=None`, unless `inputs.return_logits` is True (model
        forward argument `return_logits`). With labels otherwise (evaluation): both."""
        log_prior = self.log_prior(inputs.hidden)
        latents = self.latent_states(inputs)
        weight = inputs.embeddings if self.weight is None else self.weight
        aux = self.aux_loss(log_prior, labels) if self.training and labels is not None else None
        if self.needs_logits(inputs, labels):
            logits = mixture_log_probs(log_prior, latents, weight, self.bias)
            nll = nll_sum_from_logits(logits, labels) if labels is not None else None
            return HeadOutput(logits=logits, nll_sum=nll, aux_loss=aux)
        nll = mixture_nll_sum(log_prior, latents, weight, self.bias, labels)
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
        latent_map = latent_map * self.conversion_scale
        if self.weight is not None:
            self.weight.div_(self.conversion_scale)
        for group, ((layer, count), linear) in enumerate(zip(self.groups, self.latents)):
            linear.bias.zero_()
            top = layer == self.dims.num_layers
            self.set_latent_map(group, latent_map.repeat(count, 1) if top else torch.zeros_like(linear.weight))
            exact = exact and top
        return exact
