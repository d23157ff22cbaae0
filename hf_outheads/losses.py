"""Memory-lean cross-entropy of a linear layer: per-row NLL of `softmax(x W^T + b)` without
ever holding the `N x |V|` logits (nor their gradient) for all rows at once.

Used by the mixture heads for their exact loss over `J * N` latent rows; usable by any head
whose scores are `x W^T + b`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .head_interface import IGNORE_INDEX

# Logits elements per chunk (32M fp32 = 128 MB): 1,024 rows at |V| = 32K, 256 at 128K.
CHUNK_ELEMENTS = 2**25
IMPLEMENTATIONS = ("auto", "torch", "chunked", "naive")


def has_torch_linear_cross_entropy() -> bool:
    """torch >= 2.13 ships a chunked `F.linear_cross_entropy` (with `LinearCrossEntropyOptions`)."""
    return hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")


def default_chunk_rows(vocab_size: int) -> int:
    return max(64, min(4096, CHUNK_ELEMENTS // max(vocab_size, 1)))


def _naive(input, weight, target, bias, ignore_index):
    return F.cross_entropy(F.linear(input, weight, bias), target, ignore_index=ignore_index, reduction="none")


def _chunked(input, weight, target, bias, ignore_index, rows):
    """Rows in chunks; under autograd each chunk is checkpointed, so its logits are
    recomputed in backward instead of kept: peak memory is one chunk's `rows x |V|`."""
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias))
    pieces = []
    for start in range(0, input.shape[0], rows):
        args = (input[start : start + rows], weight, target[start : start + rows], bias, ignore_index)
        pieces.append(checkpoint(_naive, *args, use_reentrant=False) if grad else _naive(*args))
    return torch.cat(pieces)


def linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    chunk_rows: int | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Per-row `-log_softmax(input @ weight.T + bias)[target]`, shape `target.shape`, in fp32;
    0 (and no gradient) where `target == ignore_index`.

    `input` is `(..., d)`, `weight` `(|V|, d)`, `bias` `(|V|,)`. Computed in fp32 whatever the
    parameters' dtype (low-precision inputs are upcast). `impl`:
      - "auto": "torch" when the installed torch has it, else "chunked";
      - "torch": `F.linear_cross_entropy(..., reduction="none", options=LinearCrossEntropyOptions(
        batch_chunk_size=chunk_rows))`, which recomputes each chunk's logits in backward;
      - "chunked": the same with plain autograd (`torch.utils.checkpoint` per row chunk);
      - "naive": full logits (reference for tests).
    `chunk_rows` defaults to `default_chunk_rows(|V|)` (about 128 MB of logits per chunk).
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl={impl!r} is not one of {list(IMPLEMENTATIONS)}.")
    shape = target.shape
    input, target = input.reshape(-1, input.shape[-1]).float(), target.reshape(-1)
    weight, bias = weight.float(), (bias.float() if bias is not None else None)
    if input.shape[0] != target.shape[0]:
        raise ValueError(f"{input.shape[0]} input rows but {target.shape[0]} targets.")
    if input.shape[0] == 0:
        return input.sum(-1).reshape(shape)  # empty, still attached to the graph
    rows = chunk_rows or default_chunk_rows(weight.shape[0])
    if impl == "auto":
        impl = "torch" if has_torch_linear_cross_entropy() else "chunked"
    if impl == "naive":
        nll = _naive(input, weight, target, bias, ignore_index)
    elif impl == "chunked":
        nll = _chunked(input, weight, target, bias, ignore_index, rows)
    else:
        options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=rows, chunking_method=None)
        nll = F.linear_cross_entropy(
            input, weight, target, linear_bias=bias, reduction="none", ignore_index=ignore_index, options=options
        )
    return nll.reshape(shape)
