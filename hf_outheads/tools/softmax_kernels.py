"""Triton kernels of the fused losses' `|V|`-wide work on a GPU (`losses.fused_mixture_nll`):
after a chunk's scores `x W^T` come out of one matrix product, everything the loss and its
gradient need of them is two passes over each row, instead of a dozen fp32 elementwise passes:

  - `row_stats`: per row, the log-normaliser `lse = logsumexp_v s_v` (an online maximum and sum
    over blocks of the row) and the target's score `s_y`, in fp32;
  - `softmax_grad_`: per row, `scale * (exp(s - lse) (1 + 2 c lse) - onehot(y)) * ds/dz`, written
    over the scores in their own dtype (bf16 under autocast), ready for the two gradient products
    (`dx = G W`, `dW = G^T x`); `c` is the z-loss coefficient (`c lse^2` per row, PaLM's z-loss).

`s = z + b` (fp32 bias added in the kernel); with `sigsoftmax` `s = z + b + log sigma(z + b)`
(Kanai et al. 2018, Eq. 8; `ds/dz = 2 - sigma(z)`); with a soft cap `cap`, `s = cap tanh((z + b) /
cap)` (Gemma 2's final logit soft-capping; `ds/dz = 1 - (s / cap)^2`). `scale` is the row's weight in the summed
loss: 1 for one softmax, a mixture component's responsibility `r_j = pi_j p_j(y) / p(y)` (Yang et
al. 2018, Sec. 3.3), 0 for an ignored row. Liger-Kernel's fused linear cross-entropy does the same
two passes for one softmax (with a soft cap and a z-loss); these kernels add the bias, the
sigsoftmax epilogue and a per-row scale, which a mixture needs and no peer offers.

Imported on first use where `loss_kernels.use_triton`, from the installed package (`losses.triton_kernels`:
a saved folder does not carry this file); on a CPU, Triton's interpreter runs them
(`TRITON_INTERPRET=1` set before Triton is imported), which the tests use.
"""

from __future__ import annotations

import torch

try:  # (the package does not require Triton: the fused loss runs plain torch without it)
    import triton
    import triton.language as tl
except ImportError as error:
    raise ImportError("The fused losses' GPU kernels need Triton (it comes with torch's CUDA builds; "
                      "pip install triton).") from error

MAX_BLOCK = 8192  # scores a program holds at once (fp32 registers: 16 a thread at 16 warps)


@triton.jit
def _tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))  # (Triton's language has no tanh; this form does not overflow)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _scores(z_ptr, b_ptr, offs, mask, cap, HAS_BIAS: tl.constexpr, SIGSOFTMAX: tl.constexpr, SOFTCAP: tl.constexpr):
    """Scores `s` (fp32, -inf outside the row) of one block of a row, and `ds/dz`."""
    z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = z
    slope = tl.full(z.shape, 1.0, tl.float32)
    if SIGSOFTMAX:  # log sigma(z) = min(z, 0) - log(1 + exp(-|z|))
        s = z + tl.minimum(z, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(z)))
        slope = 2.0 - tl.sigmoid(z)
    if SOFTCAP:
        t = _tanh(z / cap)
        s = t * cap
        slope = 1.0 - t * t
    return tl.where(mask, s, float("-inf")), slope


@triton.jit
def _row_stats_kernel(z_ptr, stride, b_ptr, y_ptr, lse_ptr, target_ptr, cap, V: tl.constexpr,
                      HAS_BIAS: tl.constexpr, SIGSOFTMAX: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * stride
    m = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        s, _ = _scores(z_row, b_ptr, offs, offs < V, cap, HAS_BIAS, SIGSOFTMAX, SOFTCAP)
        m_new = tl.maximum(m, tl.max(s, 0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new), 0)
        m = m_new
    tl.store(lse_ptr + row, m + tl.log(total))
    y = tl.load(y_ptr + row)
    valid = y >= 0
    offs = tl.maximum(y, 0) + tl.arange(0, 1)
    s_y, _ = _scores(z_row, b_ptr, offs, offs < V, cap, HAS_BIAS, SIGSOFTMAX, SOFTCAP)
    tl.store(target_ptr + row, tl.where(valid, tl.sum(s_y, 0), 0.0))


@triton.jit
def _grad_kernel(z_ptr, stride, b_ptr, y_ptr, lse_ptr, scale_ptr, cap, z_loss, V: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SIGSOFTMAX: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * stride
    lse = tl.load(lse_ptr + row)
    scale = tl.load(scale_ptr + row)
    y = tl.load(y_ptr + row)
    spread = 1.0 + 2.0 * z_loss * lse  # d(c lse^2)/ds = 2 c lse softmax(s)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        s, slope = _scores(z_row, b_ptr, offs, mask, cap, HAS_BIAS, SIGSOFTMAX, SOFTCAP)
        grad = (tl.exp(s - lse) * spread - tl.where(offs == y, 1.0, 0.0)) * slope
        tl.store(z_row + offs, (grad * scale).to(z_ptr.dtype.element_ty), mask=mask)


def _launch(scores: torch.Tensor, bias: torch.Tensor | None):
    rows, vocab = scores.shape
    if scores.stride(1) != 1:
        raise ValueError("The softmax kernels need rows of contiguous scores.")
    block = min(MAX_BLOCK, triton.next_power_of_2(vocab))
    meta = dict(HAS_BIAS=bias is not None, BLOCK=block, num_warps=16 if block >= 4096 else 8)
    return (rows,), scores.stride(0), (scores if bias is None else bias), vocab, meta


def row_stats(scores: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
              sigsoftmax: bool = False, softcap: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`(lse, s_y)` (fp32, one per row) of `scores (rows, |V|)` plus `bias` (soft-capped at `softcap`
    when non-zero); `s_y = 0` where the label is negative (ignored)."""
    grid, stride, bias_arg, vocab, meta = _launch(scores, bias)
    lse = torch.empty(scores.shape[0], dtype=torch.float32, device=scores.device)
    target = torch.empty_like(lse)
    if scores.shape[0]:
        _row_stats_kernel[grid](scores, stride, bias_arg, labels, lse, target, float(softcap or 1.0), vocab,
                                SIGSOFTMAX=sigsoftmax, SOFTCAP=bool(softcap), **meta)
    return lse, target


def softmax_grad_(scores: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, lse: torch.Tensor,
                  scale: torch.Tensor, sigsoftmax: bool = False, softcap: float = 0.0,
                  z_loss: float = 0.0) -> torch.Tensor:
    """Overwrite `scores` with `scale * (softmax(s) (1 + 2 z_loss lse) - onehot(y)) * ds/dz`, the
    gradient of the summed loss (NLL plus `z_loss * lse^2` per row) w.r.t. the scores before the
    bias, given `lse` from `row_stats` (same `sigsoftmax`, `softcap`)."""
    grid, stride, bias_arg, vocab, meta = _launch(scores, bias)
    if scores.shape[0]:
        _grad_kernel[grid](scores, stride, bias_arg, labels, lse, scale.float().contiguous(), float(softcap or 1.0),
                           float(z_loss), vocab, SIGSOFTMAX=sigsoftmax, SOFTCAP=bool(softcap), **meta)
    return scores
