"""Word-code tables of the `lightrnn` head: layout, initialisation from word counts, and the
re-assignment of words to cells (Kong, Xie, Dai, Hovy 2019, "HybridLightRNN", Eq. 3 and 6;
LightRNN, Li et al. 2016).

A table is one integer per word, `codes[w]` in `[0, F + R*C)`: a code `< F` is the exclusive
single code of one of the F most frequent words; code `F + r*C + c` is cell `(r, c)` of the
`R x C` table (first code `F + r`, second code `c`). A valid table is injective (no two words
share a code); codes no word holds are empty and get no probability. The paper instead pads
the vocabulary with unused words so that codes and words are in bijection.

Re-assignment (paper Eq. 3, 6): given the cost `row_cost[w, r]` of every table word in every
row and `col_cost[w, c]` in every column (its accumulated negative log-likelihood), place the
table words in the cells minimising `sum_w row_cost[w, r(w)] + col_cost[w, c(w)]`; exclusive
words keep their codes. Two solvers, both never worse than the current placement:
  - "exact": one rectangular assignment problem, words x cells (scipy's
    `linear_sum_assignment`, O(n^3) for n table words): used when `n * R * C <= exact_limit`;
  - "alternating" (approximation): block-coordinate descent from the current placement. Pass
    (a) re-assigns, in every column, its words to the rows (an exact `R x R` problem on
    `row_cost`, empty cells cost 0), pass (b), in every row, its words to the columns (exact
    `C x C` on `col_cost`); each pass contains the current placement, so the cost never
    increases. A sweep costs `C` problems of size R and `R` of size C, O(|V| (R^2 + C^2)) in
    the worst case; sweeps repeat until one gains nothing. Any permutation of a grid is a
    product of column-, row- and column-internal permutations, so no placement is out of
    reach, but the descent can stop at a local optimum. The paper uses Preis's linear-time
    1/2-approximation of a matching, the LightRNN code a greedy heuristic; neither
    guarantees not to worsen the current placement. A result that is not strictly better
    keeps the old table.
Costs (paper Eq. 6): `row_cost[w, r] = -sum_t log p(first = F+r | h_t)` and `col_cost[w, c] =
-sum_t log p(second = c | h_t, first = r_w)` over the occurrences t of w, r_w its current row,
the mixture's own conditionals (unmasked): at the current table their sum is the word's NLL.
While tracking, the accumulators take `|V| (R + C)` fp32 (370 MB at |V| = 128K, default shape).
No parameter belongs to a word or a cell (only to codes: rows, columns, exclusive words), so a
re-assignment permutes no parameter: a moved word takes the scores of its new row and column,
which the costs measured; the optimiser state stays valid.
scipy is imported only when re-assigning (training), so inference and remote code never need it.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .head_interface import IGNORE_INDEX
from .losses import log_probs_chunk_rows

TABLE_INITS = ("frequency", "random")
MASKED = -1e30  # bias of codes that hold no word: exp underflows to exactly 0 in fp32
EXACT_LIMIT = 2**22  # words x cells entries of the exact problem (about 2,048 x 2,048, ~1 s)


def table_shape(vocab_size: int, F: int | None, R: int | None, C: int | None) -> tuple[int, int, int]:
    """(F, R, C) with the defaults of the unset ones (`head_lightrnn` docstring); a table too small
    for the vocabulary is an error. F = |V| // 2 (up to 4,096) was measured: on a 2,000-word BPE
    vocabulary from scratch |V| // 4 trained to a worse model than `tied`, |V| // 2 to a better
    one; from 8,192 words on F is 4,096 either way."""
    F = min(4096, vocab_size // 2) if F is None else F
    n = max(vocab_size - F, 1)
    C = C or (math.ceil(n / R) if R else math.ceil(math.sqrt(n)))
    R = R or math.ceil(n / C)
    if F + R * C < vocab_size:
        raise ValueError(f"Head 'lightrnn': num_exclusive + num_rows * num_columns = {F} + {R} * {C} codes cannot "
                         f"hold the {vocab_size} words; enlarge the table.")
    return F, R, C


def codes_from_counts(counts: torch.Tensor, F: int, R: int, C: int, order: str = "frequency", seed: int = 0):
    """The F most frequent words (ties: lower id first) get exclusive codes 0..F-1 in frequency
    order; the others fill the cells row by row, in frequency order ("frequency": each row is
    a frequency band, the paper's frequency table) or in a seeded random order ("random")."""
    counts = torch.as_tensor(counts).reshape(-1).double()
    ranked = torch.argsort(-counts, stable=True)
    exclusive, table = ranked[:F], ranked[F:]
    if table.numel() > R * C:
        raise ValueError(f"{table.numel()} table words do not fit an {R} x {C} table.")
    if order == "random":
        table = table[torch.randperm(table.numel(), generator=torch.Generator().manual_seed(seed))]
    elif order != "frequency":
        raise ValueError(f"Table order {order!r} is not one of {list(TABLE_INITS)}.")
    codes = torch.empty(counts.numel(), dtype=torch.long)
    codes[exclusive] = torch.arange(exclusive.numel())
    codes[table] = F + torch.arange(table.numel())
    return codes


def default_codes(vocab_size: int, F: int, R: int, C: int, order: str = "frequency", seed: int = 0):
    """The table before any counts are known: word ids stand in for frequency ranks (low id =
    frequent, as in frequency-sorted word vocabularies)."""
    return codes_from_counts(-torch.arange(vocab_size, dtype=torch.float64), F, R, C, order, seed)


def check_codes(codes: torch.Tensor, num_codes: int, what: str = "The word-code table") -> None:
    """Raise unless every word has one code in range and no two words share one."""
    if codes.numel() and (codes.min() < 0 or codes.max() >= num_codes):
        raise ValueError(f"{what} has codes out of range [0, {num_codes}): min {codes.min().item()}, "
                         f"max {codes.max().item()}. Every word needs a distinct code in that range.")
    if torch.unique(codes).numel() != codes.numel():
        raise ValueError(f"{what} is not injective: two words share a code, so probabilities would not sum "
                         "to 1. Every word needs a distinct code; re-create the table from word counts.")


def code_masks(codes: torch.Tensor, F: int, R: int, C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(first-code mask `(F + R,)`: exclusive codes and rows that hold a word; cell mask
    `(R, C)`: occupied cells, with empty rows left open so their column softmax stays finite;
    such rows are closed by the first-code mask)."""
    used = torch.zeros(F + R * C, dtype=torch.bool, device=codes.device).index_fill_(0, codes, True)
    cells = used[F:].view(R, C)
    rows = cells.any(1)
    return torch.cat([used[:F], rows]), cells | ~rows.unsqueeze(1)


def table_grid(codes: torch.Tensor, F: int, R: int, C: int) -> np.ndarray:
    """`(R, C)` array of the word in each cell, -1 where empty."""
    grid = np.full(R * C, -1, dtype=np.int64)
    codes = codes.cpu().numpy()
    words = np.nonzero(codes >= F)[0]
    grid[codes[words] - F] = words
    return grid.reshape(R, C)


def grid_cost(grid: np.ndarray, row_cost: np.ndarray, col_cost: np.ndarray) -> float:
    rows, cols = np.nonzero(grid >= 0)
    words = grid[rows, cols]
    return float(row_cost[words, rows].sum() + col_cost[words, cols].sum())


def _permute_lines(lines: np.ndarray, cost: np.ndarray, solve) -> np.ndarray:
    """Each line (a column of the grid, as rows of `lines`) re-places its words among its own
    slots: `cost[w, slot]`; empty slots (-1) cost 0 anywhere. Exact per line."""
    out = np.empty_like(lines)
    for i, line in enumerate(lines):
        table = np.where(line[:, None] >= 0, cost[np.maximum(line, 0)], 0.0)
        rows, slots = solve(table)
        out[i, slots] = line[rows]
    return out


def linear_sum_assignment():
    """scipy's solver, imported only to re-assign (training). The try block keeps scipy out of
    the imports transformers requires for remote code (it skips imports inside `try`)."""
    try:
        from scipy.optimize import linear_sum_assignment as solve
    except ImportError as error:
        raise ImportError("Re-assigning a code table needs scipy: pip install scipy") from error
    return solve


def assign_alternating(grid, row_cost, col_cost, max_sweeps: int = 8):
    """Block-coordinate descent (module docstring): monotone, each pass exact."""
    solve = linear_sum_assignment()

    cost = grid_cost(grid, row_cost, col_cost)
    for _ in range(max_sweeps):
        grid = _permute_lines(grid.T, row_cost, solve).T  # (a) within columns: rows
        grid = _permute_lines(grid, col_cost, solve)  # (b) within rows: columns
        new = grid_cost(grid, row_cost, col_cost)
        if new >= cost - 1e-9 * max(1.0, abs(cost)):
            break
        cost = new
    return np.ascontiguousarray(grid)


def assign_exact(grid, row_cost, col_cost):
    """Optimal placement of the table's words in its cells (one rectangular assignment)."""
    R, C = grid.shape
    words = grid[grid >= 0]
    cells = np.arange(R * C)
    cost = row_cost[words][:, cells // C] + col_cost[words][:, cells % C]
    rows, chosen = linear_sum_assignment()(cost)
    out = np.full(R * C, -1, dtype=np.int64)
    out[chosen] = words[rows]
    return out.reshape(R, C)


def reassign(grid, row_cost, col_cost, method: str = "auto", exact_limit: int = EXACT_LIMIT, max_sweeps: int = 8):
    """New grid and statistics; the old grid is kept unless the new one costs strictly less."""
    n = int((grid >= 0).sum())
    if method == "auto":
        method = "exact" if n * grid.size <= exact_limit else "alternating"
    if method not in ("exact", "alternating"):
        raise ValueError(f"Assignment method {method!r} is not one of ['auto', 'exact', 'alternating'].")
    before = grid_cost(grid, row_cost, col_cost)
    new = assign_exact(grid, row_cost, col_cost) if method == "exact" else assign_alternating(
        grid, row_cost, col_cost, max_sweeps)
    after = grid_cost(new, row_cost, col_cost)
    if not after < before:
        new, after = grid, before
    moved = int(((new != grid) & (new >= 0)).sum())
    return new, {"method": method, "cost_before": before, "cost_after": after, "moved": moved}


def codes_from_grid(codes: torch.Tensor, grid: np.ndarray, F: int) -> torch.Tensor:
    """`codes` with every table word moved to its cell in `grid`; exclusive codes unchanged."""
    new = codes.clone()
    flat = torch.from_numpy(grid.reshape(-1))
    cells = torch.nonzero(flat >= 0).squeeze(1)
    new[flat[cells].to(codes.device)] = (F + cells).to(codes.device)
    return new


def resize_codes(codes: torch.Tensor, new_size: int, F: int, R: int, C: int) -> torch.Tensor:
    """Codes of the first `new_size` words; words beyond the old vocabulary take the free
    cells, then the free exclusive codes, in code order."""
    old, codes = codes.numel(), codes[:new_size]
    if new_size > old:
        used = torch.zeros(F + R * C, dtype=torch.bool, device=codes.device).index_fill_(0, codes, True)
        free = torch.cat([torch.arange(F, F + R * C), torch.arange(F)]).to(codes.device)
        free = free[~used[free]]
        if free.numel() < new_size - old:
            raise ValueError(f"Head 'lightrnn': its table has {F} + {R} * {C} codes, too few for {new_size} "
                             "words; a larger table needs new codes: build the head with larger num_rows.")
        codes = torch.cat([codes, free[: new_size - old]])
    return codes.clone()


def row_summaries(codes, F, R, C, vectors: torch.Tensor, bias: torch.Tensor):
    """Per row, the mean of its words' `vectors` and the logsumexp of their `bias` (empty rows:
    zeros and -1e4)."""
    table = torch.nonzero(codes >= F).squeeze(1)
    rows = ((codes[table] - F) // C).to(vectors.device)
    sizes = torch.bincount(rows, minlength=R).clamp(min=1).unsqueeze(1)
    means = torch.zeros(R, vectors.shape[1], device=vectors.device).index_add_(0, rows, vectors[table]) / sizes
    top = torch.full((R,), -1e4, device=bias.device).scatter_reduce(0, rows, bias[table], "amax")
    total = torch.zeros(R, device=bias.device).index_add_(0, rows, (bias[table] - top[rows]).exp())
    return means, top + total.clamp(min=1e-30).log()


def first_code_params(codes, F, R, C, vectors: torch.Tensor, bias: torch.Tensor):
    """First-code weights `(F + R, d)` and biases `(F + R,)` from per-word output `vectors` and
    `bias`: an exclusive code takes its word's, a row `row_summaries` of its words; unused
    exclusive codes zero."""
    exclusive = torch.nonzero(codes < F).squeeze(1)
    weight = torch.zeros(F, vectors.shape[1], device=vectors.device).index_copy_(0, codes[exclusive], vectors[exclusive])
    first_bias = torch.zeros(F, device=bias.device).index_copy_(0, codes[exclusive], bias[exclusive])
    row_vectors, row_bias = row_summaries(codes, F, R, C, vectors, bias)
    return torch.cat([weight, row_vectors]), torch.cat([first_bias, row_bias])


def empty_costs(vocab_size: int, R: int, C: int, device) -> list:
    """`[row_cost (|V|, R), col_cost (|V|, C), tokens]`, the accumulators of the costs (`tokens` a
    count on the device)."""
    return [torch.zeros(vocab_size, R, device=device), torch.zeros(vocab_size, C, device=device),
            torch.zeros((), dtype=torch.long, device=device)]


@torch.no_grad()
def add_costs(costs: list, codes, table, log_prior, k, s2, labels, row, W1, b1, b2) -> None:
    """Add the costs of the table words among `labels` (positions flattened; -100: ignored): `log_prior (n, K)`,
    latents `k (n, K, d)`, the label's row's column scores `s2 (n, K, C)` without the bias, `row (n,)`,
    first-code weights `W1` and bias `b1`, column bias `b2 (C,)`. Unmasked conditionals (an empty
    row or cell may receive words): `-log p(first = F+r)` for every row, `-log p(second = c |
    first = current row)` for every column, the components weighted by their posterior given the row.
    Every position is computed and the others add zeros: no position is picked by a value read back
    from the device."""
    f, r, _ = table
    words = labels.clamp_min(0)
    table_word = (codes[words] >= f) & (labels != IGNORE_INDEX)
    step = log_probs_chunk_rows(k.shape[1] * (f + r))
    for s in range(0, k.shape[0], step):
        part = slice(s, s + step)
        joint = F.linear(k[part], W1, b1).log_softmax(-1)[..., f:] + log_prior[part].unsqueeze(-1)  # log pi_j p_j(r)
        posterior = joint.gather(-1, row[part].view(-1, 1, 1).expand(-1, joint.shape[1], 1)).squeeze(-1)
        posterior = posterior - posterior.logsumexp(-1, keepdim=True)  # components given the current row
        col = torch.logsumexp(posterior.unsqueeze(-1) + (s2[part] + b2).log_softmax(-1), 1)
        counted = table_word[part].unsqueeze(-1)
        costs[0].index_add_(0, words[part], torch.where(counted, -joint.logsumexp(1), 0))
        costs[1].index_add_(0, words[part], torch.where(counted, -col, 0))
    costs[2] += table_word.sum()
