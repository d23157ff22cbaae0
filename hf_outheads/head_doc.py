"""`doc`: Direct Output Connection (Takase, Suzuki, Nagata 2018, Eq. 7-13): a mixture of
softmaxes whose components also come from middle layers:

    p(y|h) = sum_j pi_j softmax(E k_j + b)_y,   pi = softmax(W_pi h^N)   (Eq. 7, 10; J entries)
    layer n gives i_n components k = tanh(W_n h^n + b_n)                  (Eq. 11), J = sum_n i_n

Options (defaults):
  - `components` = [[-1, 15], [-2, 5]]: [backbone layer, i_n] pairs; layer n indexes the
    backbone's `hidden_states` (0 = embedding output, `num_layers` = last), negative counts from
    the end like Python (-1 = last, -2 = the one below). Default: the paper's best
    `i_3=15, i_2=5` (Table 3); its encoder-decoder setting is [[-1, 2], [-2, 2]] on the
    decoder (Table 9). Stored as a JSON-safe list of pairs (a {layer: count} dict is accepted).
    With every component on the last layer, `doc` is `mos` (same parameter names and values).
  - `regularizer_weight` = 0.001: lambda of Eq. 12-13 (best in Table 3).
  - `middle_layer_norm` = True: middle-layer states go through a parameter-free layer norm.
  - `latent_dim`, `tied`, `latent_activation`, `latent_init`, `latent_init_noise`, `map_scale`,
    `latent_dropout`, `dropout_kind`:
    as `mos`, with `mos`'s measured defaults (own output matrix, identity latents started at
    `I`, uniform prior; departure from the paper's tanh latents and tied E, see `head_mos`).
    `dropout_kind="locked"` draws one mask per sequence shared by all components and time steps
    (reference code); the paper's rate is 0.6 (Table 2), the default 0.0 (see `head_mos`).

Regulariser (paper Eq. 12-13, only in training with labels; `aux_loss` of the model output):
`B = sum_t pi_t` over the batch's positions whose label is not -100 (padding and prompt
positions carry no loss), `beta = (std(B) / mean(B)) ** 2` with the population std over the J
entries (Shazeer et al. 2017's `cv_squared`), `aux_loss = lambda * beta`. The reference code
(nttcslab-nlp/doc_lm) computes something else: a variance over all `batch x J` prior entries
times (J - 1); this is the paper's form.

Departures: the last layer `h^N` is `inputs.hidden`, the state every head reads (the
backbone's final norm and `hidden_scale` applied), not `hidden_states[-1]` (the same in most
HF backbones); middle layers are raw residual streams of a transformer, unbounded unlike the
paper's LSTM outputs, hence `middle_layer_norm`. Eq. 11 as printed has no tanh; the reference
code has it (`latent_activation="identity"` gives the printed form). Log-space mixing, exact
chunked loss, `logits=None` in training and the repetition penalty: as `head_mos`.
Conversion from a pretrained LM is exact only without middle-layer components
(see `MixtureHead.init_from_lm_head`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .head_interface import IGNORE_INDEX, HeadInputs, Paper, register_head
from .mixture import MixtureHead, SoftmaxMixtureOptions
from .head_options import HeadDims, flag, number, pairs


def resolve_layer(layer: int, num_layers: int) -> int:
    """Index into `hidden_states` (num_layers + 1 entries); negative counts from the end."""
    resolved = layer + num_layers + 1 if layer < 0 else layer
    if not 0 <= resolved <= num_layers:
        raise ValueError(
            f"Head 'doc': layer {layer} does not exist; this backbone has hidden_states 0..{num_layers} "
            f"(0 = embedding output, {num_layers} or -1 = last layer)."
        )
    return resolved


@dataclass
class DOCOptions(SoftmaxMixtureOptions):
    components: list = pairs(lambda: [[-1, 15], [-2, 5]], names=("layer", "count"), help=(
        "[layer, count] pairs: count components from backbone layer `layer` (-1: the last, as Python indexes; 0: "
        "the embeddings' output)"))
    regularizer_weight: float = number(0.001, low=0.0, help="lambda of the coefficient-of-variation regulariser (Eq. 12-13)")
    middle_layer_norm: bool = flag(True, help="a parameter-free layer norm on the middle layers' states")

    def groups(self, dims: HeadDims) -> list[tuple[int, int]]:
        return [(resolve_layer(layer, dims.num_layers), count) for layer, count in self.components]

    def complete(self, dims: HeadDims) -> None:
        layers = [layer for layer, _ in self.groups(dims)]
        if len(set(layers)) != len(layers):
            self.fail(f"option 'components' names a layer twice: {self.components}.")
        super().complete(dims)


@register_head
class DOCHead(MixtureHead):
    head_type = "doc"
    Options = DOCOptions
    papers = (Paper("Direct Output Connection for a High-Rank Language Model", "https://aclanthology.org/D18-1489", """\
@inproceedings{takase-etal-2018-direct,
  title = {Direct Output Connection for a High-Rank Language Model},
  author = {Takase, Sho and Suzuki, Jun and Nagata, Masaaki},
  booktitle = {Proceedings of the 2018 Conference on Empirical Methods in Natural Language Processing},
  year = {2018},
  pages = {4599--4609}
}""", arxiv="1808.10143"),)
    benchmark_options = {"": {"components": [[-1, 10], [-2, 5]]}}  # J = 15, as mos
    contract_options = {"components": [[-1, 2], [1, 1], [0, 1]], "latent_dropout": 0.1}
    shared_dropout_mask = True

    def component_groups(self) -> list[tuple[int, int]]:
        return self.options.groups(self.dims)

    @property
    def unlabelled_training_loss(self) -> str | None:
        if self.options.regularizer_weight == 0:
            return None
        return "its regulariser of the mixture weights (Eq. 12-13) is not applied (it needs the labels)"

    def layer_state(self, inputs: HeadInputs, layer: int) -> torch.Tensor:
        state = super().layer_state(inputs, layer)
        if layer != self.dims.num_layers and self.options.middle_layer_norm:
            state = F.layer_norm(state, state.shape[-1:])
        return state

    def aux_loss(self, log_prior: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """`lambda * (std(B) / mean(B))^2`, `B = sum of pi over the non-ignored positions` (Eq. 12-13)."""
        if self.options.regularizer_weight == 0:
            return None
        prior = log_prior.exp().reshape(-1, self.total_components)
        keep = (labels.reshape(-1) != IGNORE_INDEX).to(prior.dtype)
        total = (prior * keep.unsqueeze(-1)).sum(0)  # B, (J,)
        mean = total.mean()
        # clamp the square, not the mean (tiny ** 2 underflows to 0): no kept label gives beta = 0, not NaN
        beta = total.var(correction=0) / (mean * mean).clamp_min(torch.finfo(mean.dtype).tiny)
        return self.options.regularizer_weight * beta
