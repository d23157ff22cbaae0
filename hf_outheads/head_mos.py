"""`mos`: Mixture of Softmaxes (Yang et al. 2018, "Breaking the Softmax Bottleneck", Sec. 3.3;
written as DOC paper Eq. 7-11 with every component on the last layer):

    p(y|h) = sum_j pi_j softmax(E k_j + b)_y,  pi = softmax(W_pi h) (no bias),  k_j = tanh(W_j h + b_j)

(paper form; the defaults below use `W` instead of `E` and identity latents `k_j = W_j h + b_j`).

All K latents come from one `Linear(d_h, K * d)` (reference zihangdai/mos); `tied=False` gives
the components their own `|V| x d` matrix `W` instead of `E`; `b` is shared by all components.

Options (defaults):
  - `num_components` = 15: K of the paper's language models (Efficient-MoS translation: 9;
    3 in budget comparisons). The head costs about K times a single softmax.
  - `latent_dim` = None (the embedding width d; must be d when `tied`).
  - `tied` = False, `latent_activation` = "identity", `latent_init` = "identity": the
    components score with their own `|V| x d` matrix `W` (N(0, 0.02^2)), latents
    `k_j = W_j h + b_j` start at `W_j = I + N(0, latent_init_noise^2)`, `b_j = 0`, and the prior at a uniform
    `pi` (`W_pi = 0`). Departure, chosen by measurement: MoS as published
    (`tied=True`, `latent_activation="tanh"`, `latent_init="uniform"`: torch's Linear init)
    trains to a much worse model than the tied head on a from-scratch transformer LM:
    tanh bounds the latents that replace the backbone's unbounded final-norm state, and E at
    a transformer's init (N(0, 0.02^2)) scores flatter than the reference's uniform(-0.1, 0.1).
    Identity latents also make a converted pretrained LM exact (`MixtureHead.init_from_lm_head`).
  - `latent_init_noise` = 0.02: std of the noise on the identity maps (on the effective maps,
    whatever `map_scale`); it lets identical components drift apart (with 0 and the uniform
    prior they stay identical: the head is `linear`). Not used when converting (the
    components start exactly at the original head; a random prior separates them).
  - `map_scale` = None: 0.01 from scratch, 1 when converted from a trained head. Each latent map
    is stored as `W_j = (1 - s) I + s A_j`, so under Adam it moves s times as far per step as a
    plain parameter (as `bilinear`/`joint`'s `map_scale`). Departure, chosen by measurement: with
    plain maps (`map_scale=1`, the paper's form) the mixture trained from scratch to a worse
    model than its own K = 1 case, the untied `linear` head; at 0.01 to a better one.
  - `latent_dropout` = 0.0, `dropout_kind` = "locked" (reference: LockedDropout on the
    `(T, B, K*d)` latents, i.e. a separate mask per component shared over time steps).
    Departure: the reference PTB rate is 0.29; a transformer backbone brings its own dropout
    and the Efficient-MoS (Transformer) code uses none on the latents, so 0.0 by default.

Departures from the reference code: mixing in log space (`logsumexp`, fp32) instead of
`log(sum_j pi_j p_j + 1e-8)`, which floors log-probabilities at -18.4; the training loss is
computed exactly without the `N x K x |V|` tensor, its gradient in the same pass
(`losses.mixture_nll_sum`).

Output: `logits` are normalised log-probabilities (`returns_log_probs`), so generate's
softmax, temperature, top-k/top-p, beam search and the HF loss are unchanged. The
repetition penalty (`repetition_penalty=theta`) is not: on raw scores it divides positive
and multiplies negative scores, which depends on the scores' arbitrary offset; on
log-probabilities (all <= 0) it always multiplies, i.e. `p_y -> p_y ** theta` before
renormalisation, for every already generated token: confident tokens (p near 1) are barely
penalised, unlikely ones strongly. `encoder_repetition_penalty=theta` likewise gives
`p -> p ** (1 / theta)` to the source tokens, and `exponential_decay_length_penalty` adds
`|log p_eos| (factor ** i - 1)`, i.e. `p_eos -> p_eos ** (2 - factor ** i)`. With labels in
training mode the model returns `logits=None` (loss only) unless called with `return_logits=True`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .head_interface import Paper, register_head
from .latents import KONG_2019
from .mixture import MixtureHead, SoftmaxMixtureOptions
from .head_options import integer

YANG_2018 = Paper("Breaking the Softmax Bottleneck: A High-Rank RNN Language Model", "https://arxiv.org/abs/1711.03953",
                  """\
@inproceedings{yang2018breaking,
  title = {Breaking the Softmax Bottleneck: A High-Rank {RNN} Language Model},
  author = {Yang, Zhilin and Dai, Zihang and Salakhutdinov, Ruslan and Cohen, William W.},
  booktitle = {International Conference on Learning Representations},
  year = {2018}
}""", arxiv="1711.03953")


@dataclass
class MoSOptions(SoftmaxMixtureOptions):
    num_components: int = integer(15, minimum=1, help="K, the mixture's softmaxes (1: `linear` with a latent map)")


@register_head
class MoSHead(MixtureHead):
    head_type = "mos"
    Options = MoSOptions
    papers = (YANG_2018, KONG_2019)
    exact_conversion = True
    benchmark_options = {
        "": {"num_components": 15},
        "k3": {"num_components": 3},  # the Efficient-MoS paper's comparison point (Table 3: K = 3)
    }
    contract_options = {"num_components": 3, "latent_dropout": 0.1}
    shared_dropout_mask = False

    def component_groups(self) -> list[tuple[int, int]]:
        return [(self.dims.num_layers, self.options.num_components)]
