"""The prior and the component latents of the mixtures (`mos`, `doc`) and of `lightrnn`'s code
mixture: `pi = softmax(W_pi h)` (no bias) and `k_j = act(W_n h^n + b_n)` (DOC paper Eq. 7-11,
Yang et al. 2018 Sec. 3.3, Kong et al. 2019), with their options (`MixtureOptions`), inits, the
latent maps' `map_scale` and the latents' dropout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .head_interface import HeadInputs, Paper
from .head_options import HeadDims, choice, flag, integer, number, probability
from .scaled_map import MapScaleOptions, ScaledMap

# the paper of the mixtures with a code table (Efficient MoS, HybridLightRNN): cited by `mos` and `lightrnn`
KONG_2019 = Paper("Fast and Simple Mixture of Softmaxes with BPE and Hybrid-LightRNN for Language Generation",
                  "https://arxiv.org/abs/1809.09296", """\
@inproceedings{kong2019fast,
  title = {Fast and Simple Mixture of Softmaxes with {BPE} and Hybrid-{LightRNN} for Language Generation},
  author = {Kong, Xiang and Xie, Qizhe and Dai, Zihang and Hovy, Eduard},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  volume = {33},
  pages = {6626--6633},
  year = {2019}
}""", arxiv="1809.09296")

ACTIVATIONS = ("tanh", "identity")
LATENT_INITS = ("identity", "uniform")
DROPOUT_KINDS = ("locked", "standard")


@dataclass
class MixtureOptions(MapScaleOptions):
    """Options of the prior and latents (`mos`, `doc`, `lightrnn`). Defaults measured on transformer
    backbones: an own output matrix and identity latents started at the identity under a uniform
    prior, learnt at `map_scale` 0.01 from scratch; the reference codes are `tied=True`,
    `latent_activation="tanh"`, `latent_init="uniform"`, plain maps (and dropout, see the heads)."""

    latent_dim: int | None = integer(None, minimum=1, optional=True, help=(
        "width of the component latents k_j; unset: the embedding width d"))
    tied: bool = flag(False, help=(
        "score the latents with E (s_j = E k_j + b, the reference codes' `tie_weights`); false: an own "
        "|V| x latent_dim output matrix W"))
    latent_activation: str = choice("identity", ACTIVATIONS, help=(
        "activation of the latents: 'identity' (DOC Eq. 11) or 'tanh' (MoS, the reference codes)"))
    latent_dropout: float = probability(0.0, help="dropout rate on the latents (the papers: MoS 0.29, DOC 0.6 on PTB)")
    dropout_kind: str = choice("locked", DROPOUT_KINDS, help=(
        "'locked': one dropout mask per sequence for every position; 'standard': a fresh mask per element"))
    latent_init: str = choice("identity", LATENT_INITS, help=(
        "'identity': each latent map starts at the identity plus noise, under a uniform prior; 'uniform': the "
        "reference codes' init"))
    latent_init_noise: float = number(0.02, 0.0, help=(
        "std of the noise on the identity-started latent maps, which lets identical components drift apart; 0 "
        "keeps the components identical"))
    # map_scale (`MapScaleOptions`): how far a step of the stored latent parameters moves the latent
    # maps (`PriorAndLatents`): 0.01 from scratch (measured: with plain maps `mos` ended behind its own
    # K = 1 case), 1 converted; configs saved before the option had plain maps
    scratch_defaults: ClassVar[dict] = {"map_scale": 0.01}
    conversion_defaults: ClassVar[dict] = {"map_scale": 1.0}
    saved_defaults: ClassVar[dict] = {"map_scale": 1.0}

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

    Each group's latent maps are one `ScaledMap` with `scale` = `map_scale` s, `base = 1 - s` (0
    with the reference init) and a scaled bias: `W_n = (1 - s) I + s A_n`, `b_n = s c_n`, so that
    under Adam-type optimisers a step of the stored `A_n, c_n` moves the map s times as far.
    s = 1 is the plain `W_n = A_n`, the stored form of earlier versions."""

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
        self.total_components = sum(count for _, count in self.groups)  # J: every group's components (mos: K)
        hidden_dim = self.dims.hidden_dim
        prior = nn.Linear(hidden_dim, self.total_components, bias=False)  # drawn either way: same seed, same init
        self.prior = prior if with_prior else None
        self.latents = nn.ModuleList(ScaledMap(hidden_dim, c * latent_size, True, self.latent_scale, self.latent_base,
                                               copies=c, scaled_bias=True) for _, c in self.groups)
        self.dropout = nn.Dropout(self.options.latent_dropout)  # holds the rate: see latent_dropout

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.groups if layer != self.dims.num_layers}))

    @property
    def latent_scale(self) -> float:
        return float(self.options.map_scale)

    @property
    def latent_base(self) -> float:
        """The identity's share `1 - s` in the latent maps (0 with the reference init)."""
        return (1.0 - self.latent_scale) if self.options.latent_init == "identity" else 0.0

    def init_prior_and_latents(self, identity: bool) -> None:
        """`identity`: every latent map starts at `I + N(0, latent_init_noise^2)` (a component scores about
        what `tied` scores), latent biases and the prior at zero (a uniform prior). Otherwise the
        reference init: torch's default Linear init, uniform(+-1/sqrt(d_h)), for every parameter.
        The effective maps start the same whatever `map_scale` (the stored values are divided by it)."""
        scale = self.latent_scale
        if identity:
            eye = torch.eye(self.latent_size, self.dims.hidden_dim)
            if self.prior is not None:
                init.zeros_(self.prior.weight)
            for (_, count), linear in zip(self.groups, self.latents):
                init.normal_(linear.weight, 0.0, self.options.latent_init_noise / scale)
                with torch.no_grad():
                    linear.weight.add_(eye.repeat(count, 1).to(linear.weight))
                init.zeros_(linear.bias)
            return
        bound = self.dims.hidden_dim**-0.5
        if self.prior is not None:
            init.uniform_(self.prior.weight, -bound, bound)
        for tensor in [p for linear in self.latents for p in linear.parameters()]:
            init.uniform_(tensor, -bound / scale, bound / scale)

    def set_latent_map(self, group: int, weight: torch.Tensor) -> None:
        """Store group `group`'s latent weights so that its effective maps are `weight`
        (`(count * d, d_h)`, a conversion), whatever `map_scale`."""
        self.latents[group].set_effective_weight(weight)

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
            linear(self.layer_state(inputs, layer)).unflatten(-1, (count, self.latent_size))
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
