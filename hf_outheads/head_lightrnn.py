"""`lightrnn`: HybridLightRNN and HybridLightRNN-MoS (Efficient MoS, Kong, Xie, Dai, Hovy 2019,
Sec. "HybridLightRNN", "Increasing the Capacity for Frequent Words"; LightRNN: Li et al. 2016).
Every word is a code sequence of length <= 2 from a learnt table:

    exclusive word w (one of the F most frequent):   p(w|h) = sum_j pi_j p_j(first = code_w | h)
    table word w in cell (r, c) of the R x C table:  p(w|h) = sum_j pi_j p_j(first = F+r | h) p_j(second = c | h, r)
    p_j(first | h) = softmax(U k_j + a) over the F + R first codes,   k_j = tanh(W_j h + b_j)
    p_j(second | h, r) = softmax(V z_jr + v) over the C columns,       z_jr = tanh(W'_j h + b'_j + e_r)

with the prior `pi = softmax(W_pi h)` and latents `k_j` of `mos` (paper Eq. 1-2, mixed in log
space: `log p(w) = logsumexp_j(log pi_j + log p_j(w))`); K = 1 is HybridLightRNN without a
mixture. `e_r` is the row's embedding, the input that conditions the column distribution.
Codes that hold no word are masked (empty rows in the first softmax, empty cells in their
row's column softmax), so `logits` are exact log-probabilities normalised over `|V|`
(`returns_log_probs`). The training loss reads only the gold codes: per position and component,
`F + R` first-code scores (the fused `losses.mixture_nll_sum`, any K) and the gold row's `C`
column scores, never `|V|`; the full distribution (generation, evaluation, `return_logits=True`)
needs every row, `(N, K, R, C)`, in position chunks: about `mos`'s cost at the same K.

Options (defaults): `num_components` = 1 (paper's MoS variants: 3, 9); `num_exclusive` (F) =
min(4096, |V| // 2); `num_columns` (C) = ceil(sqrt(|V| - F)); `num_rows` (R) = ceil((|V| - F) / C);
resolved against the vocabulary when the config is built, so the saved config states the
shape (the paper's sizes are not in our copy; F measured, see `table_shape`). `table_init` = "frequency" (rows are frequency
bands) or "random" (the paper's random-table ablation). `latent_dim`, `latent_activation`,
`latent_dropout`, `dropout_kind`: as `mos` (one locked mask for `k`, one for `z`).
`latent_activation` = "identity" as `mos` (departure: the paper's tanh latents, "tanh" here,
trained to a worse model than `tied` on a from-scratch transformer LM; identity latents to a
better one). `latent_init` = "uniform": the latent maps start at torch's Linear init (the form
every comparison of this head measured); "identity" starts them at `I + noise` as `mos`'s.
`tied` = False (paper: codes have their own embeddings); True scores exclusive codes with the
input embeddings of their words (E[w] k_j).

The table (`codes`, an int64 buffer: saved, loaded, carried by remote code), its costs and
re-assignment: `lightrnn_table.py`. Training hooks (head interface): `set_word_counts` (initial
table), `begin_periodic_updates` = `track_code_costs(True)` (training forwards with labels add
the costs), `periodic_update(reduce)` = `reassign_codes(reduce=reduce)`.

Departures: the second code is predicted in the same step from `h` and `e_r` (the paper's
decoder reads the first code as its next input); one prior mixes whole words (the paper's
decoder has a MoS at each code step); empty codes are masked instead of padded with dummy
words; costs are accumulated from the training forwards (dropout on, parameters moving)
instead of a separate pass; the assignment solver is exact or monotone (see `lightrnn_table`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .head_interface import (IGNORE_INDEX, HeadInputs, HeadOutput, OutputHead, Paper, TiedToEmbeddings,
                             nll_sum_from_logits, register_head, word_count_vector)
from .lightrnn_table import (EXACT_LIMIT, MASKED, TABLE_INITS, add_costs, check_codes, code_masks,
                             codes_from_counts, codes_from_grid, default_codes, empty_costs, first_code_params, reassign,
                             resize_codes, table_grid, table_shape)
from .losses import grad_needed, log_probs_chunk_rows, mixture_nll_sum, over_row_chunks
from .latents import KONG_2019, LATENT_INITS, MixtureOptions, PriorAndLatents
from .head_options import HeadDims, choice, integer


@dataclass
class LightRNNOptions(MixtureOptions):
    # plain maps (map_scale 1) from scratch too: every measurement of this head used them
    scratch_defaults: ClassVar[dict] = {"map_scale": 1.0}

    num_components: int = integer(1, minimum=1, help="K, the mixture's components (1: HybridLightRNN)")
    num_exclusive: int | None = integer(None, minimum=0, optional=True, help=(
        "F, the words with an exclusive code; unset: half of the vocabulary, at most 4,096"))
    # the latents start at torch's Linear init (every measurement of this head), with plain maps (map_scale 1)
    latent_init: str = choice("uniform", LATENT_INITS, help=(
        "'uniform': torch's Linear init; 'identity': each latent map starts at the identity plus noise"))
    num_rows: int | None = integer(None, minimum=1, optional=True, help=(
        "R, the word table's rows; unset: as many as the words without an exclusive code need"))
    num_columns: int | None = integer(None, minimum=1, optional=True, help=(
        "C, the word table's columns; unset: about the square root of the words without an exclusive code"))
    table_init: str = choice("frequency", TABLE_INITS, help=(
        "how the words are first placed: 'frequency' (by training-set counts) or 'random'"))

    def complete(self, dims: HeadDims) -> None:
        """The table shape from the vocabulary (module docstring), so a saved config states it."""
        super().complete(dims)
        shape = table_shape(dims.vocab_size, self.num_exclusive, self.num_rows, self.num_columns)
        self.num_exclusive, self.num_rows, self.num_columns = shape


@register_head
class LightRNNHead(TiedToEmbeddings, PriorAndLatents, OutputHead):
    """`PriorAndLatents` (the prior only with K > 1: log pi = 0 otherwise) plus the code parameters."""

    head_type = "lightrnn"
    Options = LightRNNOptions
    returns_log_probs = True
    plain_export_limit = "a word's probability is a product of its codes' softmaxes (a mixture of them with K > 1)"
    papers = (KONG_2019, Paper("LightRNN: Memory and Computation-Efficient Recurrent Neural Networks",
                               "https://arxiv.org/abs/1610.09893", """\
@inproceedings{li2016lightrnn,
  title = {{LightRNN}: Memory and Computation-Efficient Recurrent Neural Networks},
  author = {Li, Xiang and Qin, Tao and Yang, Jian and Liu, Tie-Yan},
  booktitle = {Advances in Neural Information Processing Systems},
  volume = {29},
  year = {2016}
}""", arxiv="1610.09893"))
    benchmark_options = {
        "": {"num_components": 1},  # HybridLightRNN, default table (F = 4096, ~168 x 168 at 32K)
        "k3": {"num_components": 3},  # HybridLightRNN-MoS, vs mos-k3
        "k15": {"num_components": 15},  # vs mos (K = 15)
    }
    # 8 exclusive codes + an 8 x 16 table for 99 words: 37 empty cells, two empty rows
    contract_options = {"num_components": 2, "num_exclusive": 8, "num_rows": 8, "num_columns": 16,
                        "latent_dropout": 0.1}
    updates_periodically = True  # re-assigns its table: see the module docstring

    def __init__(self, options: LightRNNOptions, dims: HeadDims):
        super().__init__(options, dims)
        options, K = self.options, self.options.num_components
        self.build_prior_and_latents([(dims.num_layers, K)], options.latent_dim or dims.embed_dim, with_prior=K > 1)
        self.table = (options.num_exclusive, options.num_rows, options.num_columns)
        (f, r, c), d = self.table, self.latent_size
        self.column_latents = nn.Linear(dims.hidden_dim, K * d)
        self.first_weight = nn.Parameter(torch.empty(r if options.tied else f + r, d))
        self.first_bias = nn.Parameter(torch.empty(f + r))
        self.row_embedding = nn.Parameter(torch.empty(r, d))
        self.second_weight = nn.Parameter(torch.empty(c, d))
        self.second_bias = nn.Parameter(torch.empty(c))
        self.register_buffer("codes", self.default_table())
        self.tracking_code_costs, self._costs = False, None
        self._conversion = None  # (word vectors, biases) of a conversion, until the table is set from counts

    @property
    def reads_embeddings(self) -> bool:  # `TiedToEmbeddings`: E scores the exclusive codes
        return self.options.tied

    def default_table(self) -> torch.Tensor:
        return default_codes(self.dims.vocab_size, *self.table, self.options.table_init)

    def reset_parameters(self) -> None:
        """Linear-layer init (as `mos`) for prior and latents, uniform(-0.1, 0.1) for code
        embeddings (as `mos`'s untied W), zero biases, the default table."""
        self.init_prior_and_latents(identity=self.options.latent_init == "identity")
        bound = self.dims.hidden_dim**-0.5
        for tensor in self.column_latents.parameters():
            init.uniform_(tensor, -bound, bound)
        for tensor in (self.first_weight, self.row_embedding, self.second_weight):
            init.uniform_(tensor, -0.1, 0.1)
        init.zeros_(self.first_bias)
        init.zeros_(self.second_bias)
        init.copy_(self.codes, self.default_table().to(self.codes.device))
        self._conversion = None

    def check_state(self) -> None:
        """A loaded table gives every word a distinct code in range (`lightrnn_table.check_codes`)."""
        check_codes(self.codes, self.table[0] + self.table[1] * self.table[2], "Head 'lightrnn': the loaded 'head.codes'")

    # ----- the distribution -----
    def code_states(self, inputs: HeadInputs):
        """(log pi `(n, K)`, k `(n, K, d)`, column pre-activations `(n, K, d)`, their dropout
        mask or None), positions flattened."""
        h, K, d = inputs.hidden, self.total_components, self.latent_size
        k = self.latent_states(inputs).float()
        pre = self.column_latents(h).unflatten(-1, (K, d)).float()
        mask = self.latent_dropout(torch.ones_like(pre)) if self.training and self.dropout.p else None
        log_prior = self.log_prior(h)
        flat = lambda t: None if t is None else t.reshape(-1, K, d)
        return log_prior.reshape(-1, log_prior.shape[-1]), flat(k), flat(pre), flat(mask)

    def code_params(self, embeddings: torch.Tensor):
        """fp32 (W1, b1, E_row, W2, B2): first-code weights and bias, row embeddings, column
        weights, and `B2 (R, C)` the column bias per row; empty codes' biases are MASKED, so
        their probability is exactly 0 (exp underflows) and every softmax stays finite."""
        f, r, c = self.table
        first = self.first_weight
        if self.options.tied:  # exclusive codes score with their words' input embeddings
            words = torch.zeros(f + r * c, dtype=torch.long, device=self.codes.device)
            words.scatter_(0, self.codes, torch.arange(self.codes.numel(), device=self.codes.device))
            first = torch.cat([embeddings[words[:f]], first])
        first_open, cells_open = code_masks(self.codes, f, r, c)
        b1 = self.first_bias.float().masked_fill(~first_open, MASKED)
        b2 = self.second_bias.float().masked_fill(~cells_open, MASKED)  # (R, C)
        return first.float(), b1, self.row_embedding.float(), self.second_weight.float(), b2

    def column_latent(self, pre, row_emb, mask):
        z = pre + row_emb
        z = torch.tanh(z) if self.options.latent_activation == "tanh" else z
        return z if mask is None else z * mask

    def label_nll(self, log_prior, k, pre, mask, labels, params):
        """Summed NLL of the labels (the gold words; -100: ignored, computed for a stand-in word and
        weighing nothing), their rows' column scores `(n, K, C)` before the bias, their rows. The gold
        column's log-probability joins the prior's log-weights of `losses.mixture_nll_sum` over the
        first codes (fused: gradient in forward); columns are scored for the label's row only."""
        W1, b1, E_row, W2, b2 = params
        f, _, c = self.table
        K = k.shape[1]
        code = self.codes[labels.clamp_min(0)]
        table_word = code >= f
        cell = (code - f).clamp(min=0)
        row, col = cell // c, cell % c
        first = torch.where(labels == IGNORE_INDEX, IGNORE_INDEX, torch.where(table_word, f + row, code))
        s2 = F.linear(self.column_latent(pre, E_row[row].unsqueeze(1), mask), W2)  # (n, K, C), no bias
        lp2 = (s2 + b2[row].unsqueeze(1)).log_softmax(-1).gather(-1, col.view(-1, 1, 1).expand(-1, K, 1)).squeeze(-1)
        log_weights = log_prior + torch.where(table_word.unsqueeze(1), lp2, 0)  # log pi_j + log p_j(second | first)
        return mixture_nll_sum(log_weights, k, W1, b1, first), s2, row

    def log_probs(self, log_prior, k, pre, mask, params) -> torch.Tensor:
        """Full `log p(.|h)`, `(n, |V|)`, in checkpointed position chunks (`positions_log_probs`)."""
        K, (f, r, c) = self.total_components, self.table
        per_row = K * (r * (self.latent_size + 2 * c) + 2 * (f + r * c + self.dims.vocab_size))
        grad = grad_needed(k, pre)
        rows = log_probs_chunk_rows(per_row)
        return over_row_chunks(self.positions_log_probs, (log_prior, k, pre, mask), params, rows, grad,
                               self.dims.vocab_size)

    def positions_log_probs(self, log_prior, k, pre, mask, W1, b1, E_row, W2, b2):
        """`log p(.|h)` of a few positions: every code's probability, then each word's code."""
        f = self.table[0]
        lp1 = F.linear(k, W1, b1).log_softmax(-1)  # (n, K, F + R)
        z = self.column_latent(pre.unsqueeze(-2), E_row, None if mask is None else mask.unsqueeze(-2))
        lp2 = (F.linear(z, W2) + b2).log_softmax(-1)  # (n, K, R, C)
        per_code = torch.cat([lp1[..., :f], (lp1[..., f:, None] + lp2).flatten(-2)], -1)
        return torch.logsumexp(per_code.index_select(-1, self.codes) + log_prior.unsqueeze(-1), dim=-2)

    def forward(self, inputs: HeadInputs, labels: torch.Tensor | None = None) -> HeadOutput:
        """As `mos`: without labels `logits` = log p; with labels in training mode the loss
        from the gold codes only (`logits=None`) unless `inputs.return_logits`; otherwise both."""
        states, params = self.code_states(inputs), self.code_params(inputs.embeddings)
        if self.needs_logits(inputs, labels):
            logits = self.log_probs(*states, params).reshape(*inputs.hidden.shape[:-1], self.dims.vocab_size)
            if labels is not None and self.training and self.tracking_code_costs:
                self.accumulate_code_costs(inputs, labels)
            nll = nll_sum_from_logits(logits, labels) if labels is not None else None
            return HeadOutput(logits=logits, nll_sum=nll)
        labels = labels.reshape(-1)  # every position, ignored ones weighing nothing: no row picked by a device read
        nll, s2, row = self.label_nll(*states, labels, params)
        if self.training and self.tracking_code_costs:  # never from evaluation data
            self._add_costs(states[0].detach(), states[1].detach(), s2.detach(), labels, row, params)
        return HeadOutput(logits=None, nll_sum=nll)

    def forward_flops(self, num_positions: int) -> int:
        """Training loss path per position: K latents and K column latents from `d_h`, the prior,
        K first-code scores over `F + R` and K column scores over the label's row (`C`); the
        table's re-assignment statistics are not counted."""
        (f, r, c), K, d, d_h = self.table, self.total_components, self.latent_size, self.dims.hidden_dim
        return num_positions * (2 * 2 * d_h * K * d + 2 * d_h * K + 2 * K * d * (f + r + c))

    # ----- learning the table (the interface's periodic update) -----
    def periodic_update(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict:
        """`reassign_codes`, its statistics as `code_*` metrics."""
        return {f"code_{key}": value for key, value in self.reassign_codes(reduce=reduce).items()}

    def track_code_costs(self, enabled: bool = True) -> None:
        """While enabled, training-mode forwards with labels accumulate the code costs."""
        self.tracking_code_costs = enabled

    begin_periodic_updates = track_code_costs  # the interface's name for it

    @torch.no_grad()
    def accumulate_code_costs(self, inputs: HeadInputs, labels: torch.Tensor) -> None:
        """Add the row and column costs of this batch's table words (labels aligned with `inputs.hidden`)."""
        states, params, labels = self.code_states(inputs), self.code_params(inputs.embeddings), labels.reshape(-1)
        _, s2, row = self.label_nll(*states, labels, params)
        self._add_costs(states[0], states[1], s2, labels, row, params)

    def _add_costs(self, log_prior, k, s2, labels, row, params) -> None:
        self._costs = self._costs or empty_costs(self.dims.vocab_size, *self.table[1:], k.device)
        add_costs(self._costs, self.codes, self.table, log_prior, k, s2, labels, row, params[0],
                  self.first_bias.float(), self.second_bias.float())

    @torch.no_grad()
    def reassign_codes(self, method: str = "auto", exact_limit: int = EXACT_LIMIT, max_sweeps: int = 8,
                       reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict:
        """Re-assign the table words from the costs accumulated since the last call, reset them;
        `reduce` sums them over processes (then every process calls this, with or without costs).
        Returns {tokens, method, cost_before, cost_after, moved}; without costs, changes nothing."""
        costs, self._costs = self._costs, None
        if reduce is not None:
            row_cost, col_cost, tokens = costs or empty_costs(self.dims.vocab_size, *self.table[1:], self.codes.device)
            tokens = reduce(torch.tensor([float(tokens)], device=row_cost.device))
            costs = [reduce(row_cost), reduce(col_cost), int(tokens.item())] if tokens.item() else None
        if costs is None:
            return {"tokens": 0, "moved": 0}
        (row_cost, col_cost, tokens), (f, r, c) = costs, self.table
        tokens = int(tokens)  # (a count on the device until here: read once per update, not per step)
        grid, stats = reassign(table_grid(self.codes, f, r, c), row_cost.double().cpu().numpy(),
                               col_cost.double().cpu().numpy(), method, exact_limit, max_sweeps)
        self.codes.copy_(codes_from_grid(self.codes, grid, f))
        check_codes(self.codes, f + r * c)
        return {"tokens": tokens, **stats}

    @torch.no_grad()
    def init_table_from_counts(self, counts: torch.Tensor, order: str | None = None, seed: int = 0) -> None:
        """Frequent words exclusive, the rest placed by `order` (default: option `table_init`)."""
        codes = codes_from_counts(counts, *self.table, order or self.options.table_init, seed)
        self.codes.copy_(codes.to(self.codes.device))
        self._costs = None

    def set_word_counts(self, counts: torch.Tensor) -> None:
        """Initial table from training-set counts, only while the table is the default one: a
        table already initialised from counts, learnt or loaded is kept."""
        counts = word_count_vector(self, counts)
        if torch.equal(self.codes.cpu(), self.default_table()):
            self.init_table_from_counts(counts)
            if self._conversion is not None:  # a converted head: the code parameters follow their words
                self.convert_codes(*self._conversion)
        self._conversion = None

    @torch.no_grad()
    def resize_vocab(self, new_size: int) -> None:
        """Removed words free their codes, new words take free cells (then free exclusive
        codes); growing past `F + R*C` codes is an error (`lightrnn_table.resize_codes`)."""
        self.codes = resize_codes(self.codes, new_size, *self.table)
        self._costs = None
        self.dims = dataclasses.replace(self.dims, vocab_size=new_size)

    @torch.no_grad()
    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """Approximate (returns False), as `mos`'s conversion: latents `A h` (`tanh(eps A h)`:
        `conversion_scale`), A the identity (or the top right-singular vectors of `weight` when
        d < d_h), code scores from the words' `weight A^T / eps` and `bias` (`convert_codes`); the
        column layers stay fresh (zero ones would get no gradient). The word vectors are kept until
        `set_word_counts` re-draws the default table, so that the codes' parameters follow their words."""
        d, d_h, eps = self.latent_size, self.dims.hidden_dim, self.conversion_scale
        A = torch.eye(d, d_h) if d >= d_h else torch.linalg.svd(weight.float(), full_matrices=False)[2][:d]
        self.set_latent_map(0, (A * eps).repeat(self.total_components, 1))
        self.latents[0].bias.zero_()
        self._conversion = (weight.float() @ A.T.to(weight.device) / eps, bias.float())
        self.convert_codes(*self._conversion)
        return False

    @torch.no_grad()
    def convert_codes(self, vectors: torch.Tensor, bias: torch.Tensor) -> None:
        """First-code weights and biases from per-word output vectors and biases, for the current
        table (`lightrnn_table.first_code_params`); tied exclusive codes keep the input embeddings."""
        weight, first_bias = first_code_params(self.codes, *self.table, vectors, bias)
        self.first_bias.copy_(first_bias)
        self.first_weight.copy_(weight[-self.first_weight.shape[0]:])
