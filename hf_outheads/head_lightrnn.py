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
`F + R` first-code scores (chunked `losses.linear_cross_entropy`) and the gold row's `C` column
scores, never `|V|`; the full distribution (generation, evaluation, `return_logits=True`)
needs every row, `(N, K, R, C)`, in position chunks: about `mos`'s cost at the same K.

Options (defaults): `num_components` = 1 (paper's MoS variants: 3, 9); `num_exclusive` (F) =
min(4096, |V| // 4); `num_columns` (C) = ceil(sqrt(|V| - F)); `num_rows` (R) = ceil((|V| - F) / C);
resolved against the vocabulary when the config is built, so the saved config states the
shape (the paper's sizes are not in our copy). `table_init` = "frequency" (rows are frequency
bands) or "random" (the paper's random-table ablation). `latent_dim`, `latent_activation`,
`latent_dropout`, `dropout_kind`: as `mos` (one locked mask for `k`, one for `z`).
`tied` = False (paper: codes have their own embeddings); True scores exclusive codes with the
input embeddings of their words (E[w] k_j).

The table (`codes`, an int64 buffer: saved, loaded, carried by remote code) and how it is
learnt: `code_table.py`. Capability for training loops (`learns_code_table = True`):
`set_word_counts(counts)` (initial table), `track_code_costs(True)` (training forwards with
labels then add each table word's row and column costs), `reassign_codes()` (re-assign, reset
the costs; call it at an interval), `accumulate_code_costs(inputs, labels)` (explicit pass).
Costs (paper Eq. 6): `row_cost[w, r] = -sum_t log p(first = F+r | h_t)` and `col_cost[w, c] =
-sum_t log p(second = c | h_t, first = r_w)` over the occurrences t of w, r_w its current row,
the mixture's own conditionals (unmasked): at the current table their sum is the word's NLL.
While tracking, the accumulators take `|V| (R + C)` fp32 (370 MB at |V| = 128K, default shape).
No parameter belongs to a word or a cell (only to codes: rows, columns, exclusive words), so a
re-assignment permutes no parameter: a moved word takes the scores of its new row and column,
which the costs measured; the optimiser state stays valid.

Departures: the second code is predicted in the same step from `h` and `e_r` (the paper's
decoder reads the first code as its next input); one prior mixes whole words (the paper's
decoder has a MoS at each code step); empty codes are masked instead of padded with dummy
words; costs are accumulated from the training forwards (dropout on, parameters moving)
instead of a separate pass; the assignment solver is exact or monotone (see `code_table`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .code_table import (EXACT_LIMIT, TABLE_INITS, check_codes, code_masks, codes_from_counts, codes_from_grid,
                         default_codes, reassign, resize_codes, row_summaries, table_grid)
from .heads import (IGNORE_INDEX, HeadDims, HeadInputs, HeadOutput, check_choice, nll_sum_from_logits,
                    word_count_vector)
from .losses import linear_cross_entropy
from .mixture import MixtureHead, MixtureOptions, check_int, over_row_chunks

CHUNK_ELEMENTS = 2**24  # per position chunk of the full distribution (and of the cost accumulation)
MASKED = -1e30  # bias of codes that hold no word: exp underflows to exactly 0 in fp32


@dataclass
class LightRNNOptions(MixtureOptions):
    num_components: int = 1
    num_exclusive: int | None = None
    num_rows: int | None = None
    num_columns: int | None = None
    table_init: str = "frequency"
    tied: bool = False

    def validate(self, dims: HeadDims) -> None:
        check_int("lightrnn", 1, num_components=self.num_components)
        self.check_mixture("lightrnn", dims)
        check_choice("lightrnn", "table_init", self.table_init, TABLE_INITS)
        V = dims.vocab_size
        f = min(4096, V // 4) if self.num_exclusive is None else self.num_exclusive
        check_int("lightrnn", 0, num_exclusive=f)
        n = max(V - f, 1)
        c = self.num_columns or (math.ceil(n / self.num_rows) if self.num_rows else math.ceil(math.sqrt(n)))
        check_int("lightrnn", 1, num_columns=c)
        r = self.num_rows or math.ceil(n / c)
        check_int("lightrnn", 1, num_rows=r)
        if f + r * c < V:
            raise ValueError(f"Head 'lightrnn': num_exclusive + num_rows * num_columns = {f} + {r} * {c} codes "
                             f"cannot hold the {V} words; enlarge the table.")
        self.num_exclusive, self.num_rows, self.num_columns = f, r, c


class LightRNNHead(MixtureHead):
    head_type = "lightrnn"
    Options = LightRNNOptions
    learns_code_table = True  # capability: see the module docstring

    def __init__(self, options: LightRNNOptions, dims: HeadDims):
        options.validate(dims)  # resolves the table shape when built without a config
        super().__init__(dataclasses.replace(options, tied=True), dims, [(dims.num_layers, options.num_components)])
        self.options = options
        self.bias = None  # MixtureHead's per-word bias: codes have their own scores here
        if options.num_components == 1:
            self.prior = None  # log pi = 0: no parameter without a gradient
        self.table = (options.num_exclusive, options.num_rows, options.num_columns)
        f, r, c = self.table
        d, K = self.latent_size, self.num_components
        self.column_latents = nn.Linear(dims.hidden_dim, K * d)
        self.first_weight = nn.Parameter(torch.empty(r if options.tied else f + r, d))
        self.first_bias = nn.Parameter(torch.empty(f + r))
        self.row_embedding = nn.Parameter(torch.empty(r, d))
        self.second_weight = nn.Parameter(torch.empty(c, d))
        self.second_bias = nn.Parameter(torch.empty(c))
        self.register_buffer("codes", self.default_table())
        self.tracking_code_costs, self._costs = False, None

    def default_table(self) -> torch.Tensor:
        return default_codes(self.dims.vocab_size, *self.table, self.options.table_init)

    def reset_parameters(self) -> None:
        """Linear-layer init (as `mos`) for prior and latents, uniform(-0.1, 0.1) for code
        embeddings (as `mos`'s untied W), zero biases, the default table."""
        bound = self.dims.hidden_dim**-0.5
        linears = ([self.prior] if self.prior is not None else []) + list(self.latents) + [self.column_latents]
        for tensor in [p for linear in linears for p in linear.parameters()]:
            init.uniform_(tensor, -bound, bound)
        for tensor in (self.first_weight, self.row_embedding, self.second_weight):
            init.uniform_(tensor, -0.1, 0.1)
        init.zeros_(self.first_bias)
        init.zeros_(self.second_bias)
        init.copy_(self.codes, self.default_table().to(self.codes.device))

    def check_state(self) -> None:
        """A loaded table gives every word a distinct code in range (`code_table.check_codes`)."""
        check_codes(self.codes, self.table[0] + self.table[1] * self.table[2], "Head 'lightrnn': the loaded 'head.codes'")

    # ----- the distribution -----
    def code_states(self, inputs: HeadInputs):
        """(log pi `(n, K)`, k `(n, K, d)`, column pre-activations `(n, K, d)`, their dropout
        mask or None), positions flattened."""
        h, K, d = inputs.hidden, self.num_components, self.latent_size
        k = self.latent_states(inputs).float()
        pre = self.column_latents(h).unflatten(-1, (K, d)).float()
        mask = self.latent_dropout(torch.ones_like(pre)) if self.training and self.options.latent_dropout else None
        log_prior = (F.log_softmax(self.prior(h).float(), -1) if self.prior is not None
                     else pre.new_zeros(*h.shape[:-1], 1))
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

    def gold(self, log_prior, k, pre, mask, labels, params):
        """Per position: NLL of the gold word, its gold-row column scores `(n, K, C)` before
        the bias, its row.
        First codes through the chunked `losses.linear_cross_entropy` over the `n * K` latents
        (as `mixture.mixture_nll`), columns of the gold row only."""
        W1, b1, E_row, W2, b2 = params
        f, _, c = self.table
        K = k.shape[1]
        code = self.codes[labels]
        table_word = code >= f
        cell = (code - f).clamp(min=0)
        row, col = cell // c, cell % c
        first = torch.where(table_word, f + row, code)
        nll1 = linear_cross_entropy(k.reshape(-1, k.shape[-1]), W1, first.repeat_interleave(K), b1).view(-1, K)
        s2 = F.linear(self.column_latent(pre, E_row[row].unsqueeze(1), mask), W2)  # (n, K, C), no bias
        lp2 = (s2 + b2[row].unsqueeze(1)).log_softmax(-1).gather(-1, col.view(-1, 1, 1).expand(-1, K, 1)).squeeze(-1)
        logp = torch.where(table_word.unsqueeze(1), lp2, 0) - nll1
        return -torch.logsumexp(log_prior + logp, -1), s2, row

    def log_probs(self, log_prior, k, pre, mask, params) -> torch.Tensor:
        """Full `log p(.|h)`, `(n, |V|)`, in checkpointed position chunks."""
        K, (f, r, c) = self.num_components, self.table
        per_row = K * (r * (self.latent_size + 2 * c) + 2 * (f + r * c + self.dims.vocab_size))
        rows = max(1, CHUNK_ELEMENTS // per_row)
        grad = torch.is_grad_enabled() and (k.requires_grad or pre.requires_grad)
        return over_row_chunks(self._chunk, (log_prior, k, pre, mask), params, rows, grad, self.dims.vocab_size)

    def _chunk(self, log_prior, k, pre, mask, W1, b1, E_row, W2, b2):
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
        keep = labels.reshape(-1) != IGNORE_INDEX
        states, labels = [t if t is None else t[keep] for t in states], labels.reshape(-1)[keep]
        nll, s2, row = self.gold(*states, labels, params)
        if self.training and self.tracking_code_costs:  # never from evaluation data
            self._add_costs(states[0].detach(), states[1].detach(), s2.detach(), labels, row, params)
        return HeadOutput(logits=None, nll_sum=nll.sum())

    # ----- learning the table (capability `learns_code_table`) -----
    def track_code_costs(self, enabled: bool = True) -> None:
        """While enabled, training-mode forwards with labels accumulate the code costs."""
        self.tracking_code_costs = enabled

    @torch.no_grad()
    def accumulate_code_costs(self, inputs: HeadInputs, labels: torch.Tensor) -> None:
        """Add the row and column costs of this batch's table words (labels aligned with `inputs.hidden`)."""
        keep = labels.reshape(-1) != IGNORE_INDEX
        states, params = [t if t is None else t[keep] for t in self.code_states(inputs)], self.code_params(inputs.embeddings)
        _, s2, row = self.gold(*states, labels.reshape(-1)[keep], params)
        self._add_costs(states[0], states[1], s2, labels.reshape(-1)[keep], row, params)

    @torch.no_grad()
    def _add_costs(self, log_prior, k, s2, labels, row, params) -> None:
        """Unmasked conditionals (an empty row or cell may receive words): `-log p(first = F+r)`
        for every row, `-log p(second = c | first = current row)` for every column."""
        (f, r, c), W1, b1 = self.table, params[0], self.first_bias.float()
        if self._costs is None:
            self._costs = [torch.zeros(self.dims.vocab_size, r, device=k.device),
                           torch.zeros(self.dims.vocab_size, c, device=k.device), 0]
        table_word = self.codes[labels] >= f
        log_prior, k, s2, labels, row = (t[table_word] for t in (log_prior, k, s2, labels, row))
        step = max(1, CHUNK_ELEMENTS // (k.shape[1] * (f + r)))
        for s in range(0, k.shape[0], step):
            part = slice(s, s + step)
            joint = F.linear(k[part], W1, b1).log_softmax(-1)[..., f:] + log_prior[part].unsqueeze(-1)  # log pi_j p_j(r)
            posterior = joint.gather(-1, row[part].view(-1, 1, 1).expand(-1, joint.shape[1], 1)).squeeze(-1)
            posterior = posterior - posterior.logsumexp(-1, keepdim=True)  # components given the current row
            col = torch.logsumexp(posterior.unsqueeze(-1) + (s2[part] + self.second_bias.float()).log_softmax(-1), 1)
            self._costs[0].index_add_(0, labels[part], -joint.logsumexp(1))
            self._costs[1].index_add_(0, labels[part], -col)
        self._costs[2] += int(labels.numel())

    @torch.no_grad()
    def reassign_codes(self, method: str = "auto", exact_limit: int = EXACT_LIMIT, max_sweeps: int = 8) -> dict:
        """Re-assign the table words to cells from the costs accumulated since the last call
        (summed over processes under torch.distributed), then reset them. Returns
        {tokens, method, cost_before, cost_after, moved}; without costs, changes nothing."""
        costs, self._costs = self._costs, None
        if costs is None:
            return {"tokens": 0, "moved": 0}
        row_cost, col_cost, tokens = costs
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            counts = torch.tensor([float(tokens)], device=row_cost.device)
            for tensor in (row_cost, col_cost, counts):
                torch.distributed.all_reduce(tensor)
            tokens = int(counts.item())
        f = self.table[0]
        grid, stats = reassign(table_grid(self.codes, *self.table), row_cost.double().cpu().numpy(),
                               col_cost.double().cpu().numpy(), method, exact_limit, max_sweeps)
        self.codes.copy_(codes_from_grid(self.codes, grid, f))
        check_codes(self.codes, f + self.table[1] * self.table[2])
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

    @torch.no_grad()
    def resize_vocab(self, new_size: int) -> None:
        """Removed words free their codes, new words take free cells (then free exclusive
        codes); growing past `F + R*C` codes is an error (`code_table.resize_codes`)."""
        self.codes = resize_codes(self.codes, new_size, *self.table)
        self._costs = None
        self.dims = dataclasses.replace(self.dims, vocab_size=new_size)

    @torch.no_grad()
    def init_from_lm_head(self, weight, bias, embeddings) -> bool:
        """Approximate (returns False), as `mos`'s tanh conversion: `k = tanh(eps A h)` with A the
        identity (or the top right-singular vectors of `weight` when d < d_h), exclusive codes
        score `weight[w] A^T / eps + bias[w]`, a row the mean of its words' vectors and the
        logsumexp of their biases; the column layers keep their fresh initialisation (zeroing
        both `z`'s inputs and the column weights would leave them without gradients). The
        table stays as it is."""
        d, d_h, eps, (f, r, c) = self.latent_size, self.dims.hidden_dim, self.tanh_init_scale, self.table
        A = torch.eye(d, d_h) if d >= d_h else torch.linalg.svd(weight.float(), full_matrices=False)[2][:d]
        vectors, bias = weight.float() @ A.T.to(weight.device) / eps, bias.float()
        self.latents[0].weight.copy_((A * eps).repeat(self.num_components, 1))
        self.latents[0].bias.zero_()
        exclusive = torch.nonzero(self.codes < f).squeeze(1)
        row_vectors, row_bias = row_summaries(self.codes, f, r, c, vectors, bias)
        self.first_bias[:f].zero_()
        self.first_bias[self.codes[exclusive]] = bias[exclusive]
        self.first_bias[f:] = row_bias
        if not self.options.tied:
            self.first_weight[:f].zero_()
            self.first_weight[self.codes[exclusive]] = vectors[exclusive]
        self.first_weight[-r:] = row_vectors
        return False
