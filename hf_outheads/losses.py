"""Memory-lean exact losses of linear scores `x W^T + b`, never holding the `N x |V|` logits (nor
their gradient) for all rows at once:

  - `mixture_nll_sum`: the summed NLL of a mixture of such softmaxes (MoS, Yang et al. 2018,
    Sec. 3.3), `-sum_i logsumexp_j(log pi_ij + log softmax(W k_ij + b)[y_i])`. Its gradient is
    computed in the forward pass, chunk by chunk over rows, as fused linear-cross-entropy
    kernels do for one softmax: the 3 matrix products of a layer's step per chunk (scores, dk,
    dW; plus db, a matrix-vector product), none in backward;
  - both run their matrix products in bf16 (fp16) under autocast to it or on bf16 (fp16) inputs:
    low-precision operands, fp32 accumulation inside the product, scores rounded once to the
    low precision and taken to fp32 for the softmax statistics; no fp32 copy of `W`;
  - `linear_cross_entropy`: one softmax, per-row (`reduction="none"`, chunks recomputed in
    backward) or summed (`reduction="sum"`, gradient in forward): the package's own path ("own",
    the mixture with K = 1) or a peer's kernel (`loss_kernels`: Liger-Kernel, cut-cross-entropy,
    torch's own), the fastest installed for the device and size by default.

On a CUDA device a chunk's `|V|`-wide work (softmax statistics, the gradient of the scores) is
two Triton kernels over the bf16 scores (`softmax_kernels`, the installed package's: a saved
folder's remote code does not carry them and runs plain torch) instead of a dozen fp32 elementwise
passes; elsewhere it is plain torch. Ignored rows (label -100) are computed and weigh nothing: no
row is picked by a value read back from the device. Under `torch.compile` the fused losses run
eagerly (a graph break: they are hand-fused already, and their row loop must not be unrolled into
the graph); under `torch.export` they are one plain computation over all rows.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from .head_interface import IGNORE_INDEX
from .logit_transforms import softcap as softcap_scores, z_loss_sum
from .loss_kernels import (PEER_KERNELS, fastest_kernel, needed_features, peer_nll_sum, unavailable, unsupported,
                           use_triton)
from .model_io import package_tool

# Every chunk size of the package's row-chunk loops (`over_row_chunks`, the fused loss's chunks).
# Logits elements per chunk of the per-row losses (32M fp32 = 128 MB): 1,024 rows at |V| = 32K, 256 at 128K.
CHUNK_ELEMENTS = 2**25
# Scores per chunk of a full distribution (a mixture's `rows x J x |V|` log-probs, lightrnn's codes and
# its code-cost accumulation): 16M (64 MB fp32).
LOG_PROBS_CHUNK_ELEMENTS = 2**24
# The fused loss: latent rows (positions x K) per chunk, at most 512 and 8M scores (32 MB fp32;
# a chunk's scores and log-probs coexist briefly). Measured at |V| = 32K: products of 255 latent
# rows are as fast as of 510, and small chunks keep the loss's peak below the head's activations.
FUSED_CHUNK_LATENTS, FUSED_CHUNK_ELEMENTS = 512, 2**23
# On a CUDA device: products of up to 4,096 rows (a GPU idles between small kernels), 128M scores
# (256 MB in bf16, the kernels' scores) per chunk: each chunk adds its `|V| x d` weight gradient
# into the fp32 one, a pass over it that fewer chunks make rarer. Not tuned on a GPU yet.
FUSED_CHUNK_LATENTS_CUDA, FUSED_CHUNK_ELEMENTS_CUDA = 4096, 2**27
LOW_PRECISION = (torch.bfloat16, torch.float16)
IMPLEMENTATIONS = ("auto", "own", "naive", *PEER_KERNELS)
REDUCTIONS = ("none", "sum")


def has_torch_linear_cross_entropy() -> bool:
    """torch >= 2.13 ships a chunked `F.linear_cross_entropy` (with `LinearCrossEntropyOptions`)."""
    return unavailable("torch", "cpu") is None


def is_traced() -> bool:
    """Inside `torch.export` / `torch.compile` tracing, where a Python loop over a tensor size
    would freeze that size into the graph."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def default_chunk_rows(vocab_size: int) -> int:
    return max(64, min(4096, CHUNK_ELEMENTS // max(vocab_size, 1)))


def log_probs_chunk_rows(elements_per_row: int) -> int:
    """Rows per chunk of a full distribution with `elements_per_row` scores (and intermediates) a row."""
    return max(1, LOG_PROBS_CHUNK_ELEMENTS // max(elements_per_row, 1))


def over_row_chunks(fn, row_args, other_args, rows: int, grad: bool, width: int) -> torch.Tensor:
    """The package's one checkpointed row-chunk loop: `fn(*row_args, *other_args)` -> `(n, width)`,
    over chunks of `rows` rows of `row_args` (None passes through), each chunk checkpointed under
    autograd (`grad`), so at most one chunk's intermediates exist at a time (recomputed in backward);
    at most `rows` rows: one call, no loop. Traced (torch.export, torch.compile): one call over all
    rows, so the graph holds for every batch and sequence size."""
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


def grad_needed(*tensors) -> bool:
    """Whether autograd will want gradients through any of `tensors` (None skipped)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def fused_chunk_rows(vocab_size: int, num_components: int, device: torch.device) -> int:
    """Positions per chunk of the fused loss: `FUSED_CHUNK_*` latent rows and scores at most,
    larger on a CUDA device."""
    latents, elements = ((FUSED_CHUNK_LATENTS_CUDA, FUSED_CHUNK_ELEMENTS_CUDA) if device.type == "cuda"
                         else (FUSED_CHUNK_LATENTS, FUSED_CHUNK_ELEMENTS))
    return max(1, min(latents, elements // max(vocab_size, 1)) // num_components)


def matmul_dtype(weight: torch.Tensor) -> torch.dtype:
    """The fused loss's matrix-product dtype: autocast's when it is on for `weight`'s device and
    low-precision, else `weight`'s own when low-precision (bf16 weights), else fp32."""
    device = weight.device.type
    if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) in LOW_PRECISION:
        return torch.get_autocast_dtype(device)
    return weight.dtype if weight.dtype in LOW_PRECISION else torch.float32


def _mix(log_prior, log_p_y, keep):
    """A chunk's summed NLL of the mixture, from `log pi_j` and `log p_j(y)` `(rows, K)` and the
    kept rows, and a function giving the responsibilities `r_j = pi_j p_j(y) / p(y)` (0 on ignored rows)."""
    joint = log_prior + log_p_y  # log pi_j + log p_j(y)
    ll = joint.logsumexp(-1)
    return -torch.where(keep, ll, 0).sum(), lambda: (joint - ll.unsqueeze(-1)).exp() * keep.unsqueeze(-1)


def _chunk(log_prior, x, weight, bias, labels, ignore_index, grads=(None,) * 4, sigsoftmax=False, softcap=0.0,
           z_loss=0.0):
    """One chunk: `(loss, z)`, the summed NLL plus the z-loss `z` (`z_loss * lse^2` per kept row, one
    component only; 0 without); adds the loss's gradients w.r.t. (log_prior, x, weight, bias) into the
    fp32 `grads` (the chunk's rows of the first two, None: not needed), in place. `x` and
    `weight` share the products' dtype (fp32, or bf16 / fp16: each product's result is taken to
    fp32); `log_prior`, `bias` and everything |V|-wide after the scores are fp32. With
    `r_j = pi_j p_j(y) / sum_k pi_k p_k(y)` (responsibilities), `dL/ds_jv = r_j (p_j(v) - [v = y])`
    and `dL/dlog pi_j = -r_j`; ignored rows have `r = 0`. `r_j` scales the small factors (`x`,
    the products with `W`), never the `|V|`-wide rows. `sigsoftmax`: each softmax is over
    `z + log sigma(z)` of the affine scores `z` (Kanai et al. 2018, Eq. 8), whose derivative
    `2 - sigma(z)` multiplies the scores' gradient in the same pass over the chunk. `softcap`: the scores
    become `c tanh(s / c)` (`logit_transforms.softcap`), whose derivative `1 - (s / c)^2` does the same;
    the z-loss adds `2 z_loss lse p` to the scores' gradient."""
    keep, low = labels != ignore_index, x.dtype in LOW_PRECISION
    scores = F.linear(x, weight).float() if low else F.linear(x, weight, bias)  # (rows, K, |V|)
    if low and bias is not None:
        scores.add_(bias)
    log_sigmoid = F.logsigmoid(scores) if sigsoftmax else None
    if sigsoftmax:  # in place where no autograd records it (the fused path; traced: out of place)
        scores = scores + log_sigmoid if torch.is_grad_enabled() else scores.add_(log_sigmoid)
    if softcap:  # as `logit_transforms.softcap`, in place where no autograd records it
        scores = softcap_scores(scores, softcap) if torch.is_grad_enabled() else scores.div_(softcap).tanh_().mul_(softcap)
    log_p = scores.log_softmax(-1)  # the chunk's |V|-wide tensor
    gold = labels.clamp_min(0).view(-1, 1, 1).expand(*x.shape[:2], 1)
    log_p_y = log_p.gather(-1, gold).squeeze(-1)
    nll, resp = _mix(log_prior, log_p_y, keep)
    z = 0.0
    if z_loss:  # lse = s_y - log p_y, per row of the one component
        lse = scores.gather(-1, gold).squeeze(-1) - log_p_y
        z = z_loss * torch.where(keep.unsqueeze(-1), lse.square(), 0).sum()
        nll = nll + z
    if all(g is None for g in grads):
        return nll, z
    g_prior, g_x, g_weight, g_bias = grads
    resp = resp()
    delta = log_p.exp_()
    if z_loss:  # p (1 + 2 c lse) - onehot(y)
        delta.mul_(lse.mul(2.0 * z_loss).add_(1.0).unsqueeze(-1))
    delta.scatter_add_(-1, gold, log_p.new_full(gold.shape, -1.0))  # p_j - onehot(y)
    if sigsoftmax:  # d(z + log sigma(z))/dz = 2 - sigma(z)
        delta.mul_(log_sigmoid.exp_().neg_().add_(2.0))
    if softcap:  # d(c tanh(z / c))/dz = 1 - (s / c)^2
        delta.mul_(scores.div_(softcap).square_().neg_().add_(1.0))
    delta = delta.flatten(0, 1)
    r = resp.reshape(-1, 1)
    if g_prior is not None:
        g_prior.sub_(resp)
    delta_mm = delta.to(x.dtype) if (g_x is not None or g_weight is not None) else None  # the products' operand
    if g_x is not None and low:
        g_x.view(-1, x.shape[-1]).copy_(torch.mm(delta_mm, weight)).mul_(r)
    elif g_x is not None:
        torch.mm(delta, weight, out=g_x.view(-1, x.shape[-1])).mul_(r)
    if g_weight is not None and low:
        g_weight.add_(torch.mm(delta_mm.T, (r * x.flatten(0, 1)).to(x.dtype)))
    elif g_weight is not None:
        g_weight.addmm_(delta.T, r * x.flatten(0, 1))
    if g_bias is not None:
        g_bias.addmv_(delta.T, resp.flatten())
    return nll, z


_FP32_OUT_PRODUCTS = [True]  # cuBLAS writes bf16 products into fp32 (`out_dtype`, torch >= 2.8 on CUDA); False once refused


def _product_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    """`out (fp32) (+)= a @ b` for low-precision `a`, `b`: on CUDA the product is accumulated in
    fp32 straight into `out` (no low-precision copy of a `|V| x d` product, no extra pass);
    elsewhere through a product in `a`'s dtype."""
    if out.is_cuda and a.dtype != out.dtype and _FP32_OUT_PRODUCTS[0]:
        try:
            if accumulate:
                torch.addmm(out, a, b, out_dtype=out.dtype, out=out)
            else:
                torch.mm(a, b, out_dtype=out.dtype, out=out)
            return
        except (RuntimeError, TypeError):  # an older torch: the products in a's dtype from now on
            _FP32_OUT_PRODUCTS[0] = False
    if a.dtype == out.dtype:
        out.addmm_(a, b) if accumulate else torch.mm(a, b, out=out)
    elif accumulate:
        out.add_(torch.mm(a, b))
    else:
        out.copy_(torch.mm(a, b))


def triton_kernels(device: torch.device):
    """The package's Triton kernels (`softmax_kernels`) where they run on `device` (`use_triton`) and
    the package is installed; None elsewhere (then `_chunk` runs)."""
    return package_tool("softmax_kernels", required=False) if use_triton(device) else None


def _chunk_kernels(kernels, log_prior, x, weight, bias, labels, ignore_index, grads=(None,) * 4, sigsoftmax=False,
                   softcap=0.0, z_loss=0.0):
    """`_chunk` on a GPU: the scores `x W^T` in the products' dtype (bf16 under autocast) are
    read twice by the `kernels` (`softmax_kernels`: statistics, then the gradient written over them)
    and never taken to fp32; the gradient of a row is scaled by its responsibility inside the kernel.
    Ignored rows (label `ignore_index`) count nothing and get zero gradients, without a host sync."""
    row_stats, softmax_grad_ = kernels.row_stats, kernels.softmax_grad_
    rows, K, d = x.shape
    flat_x, flat_labels = x.reshape(rows * K, d), labels.repeat_interleave(K)
    flat_labels = torch.where(flat_labels == ignore_index, -1, flat_labels)
    scores = torch.mm(flat_x, weight.T)  # (rows K, |V|)
    lse, target = row_stats(scores, bias, flat_labels, sigsoftmax, softcap)
    nll, resp = _mix(log_prior, (target - lse).view(rows, K), labels != ignore_index)
    z = 0.0
    if z_loss:
        z = z_loss * torch.where(flat_labels >= 0, lse.square(), 0).sum()
        nll = nll + z
    if all(g is None for g in grads):
        return nll, z
    g_prior, g_x, g_weight, g_bias = grads
    resp = resp()
    if g_prior is not None:
        g_prior.sub_(resp)
    if g_x is None and g_weight is None and g_bias is None:
        return nll, z
    delta = softmax_grad_(scores, bias, flat_labels, lse, resp.reshape(-1), sigsoftmax, softcap, z_loss)
    if g_x is not None:
        _product_into(g_x.view(-1, d), delta, weight, accumulate=False)
    if g_weight is not None:
        _product_into(g_weight, delta.T, flat_x, accumulate=True)
    if g_bias is not None:
        g_bias.add_(delta.sum(0, dtype=torch.float32))
    return nll, z


def fused_mixture_nll(log_prior, latents, weight, bias, labels, ignore_index, rows, need=(False,) * 4,
                      dtype=torch.float32, sigsoftmax=False, softcap=0.0, z_loss=0.0):
    """`(loss, z)`: the summed NLL plus the z-loss `z` (fp32 scalars; `_chunk`) of `log_prior (n, K)`,
    `latents (n, K, d)`, `labels (n,)` and, where `need`, the loss's fp32 gradients w.r.t.
    (log_prior, latents, weight, bias), in one pass over
    chunks of `rows` rows (peak: two `rows x K x |V|` tensors, a chunk's scores and log-probs,
    besides the gradients). Matrix products in `dtype` (`matmul_dtype`; `weight` is cast only when
    it has another dtype), outside autocast; gradients accumulate in fp32."""
    tensors = (log_prior, latents, weight, bias)
    grads = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) if flag and t is not None else None
             for flag, t in zip(need, tensors)]
    weight, bias = weight.to(dtype), None if bias is None else bias.float()
    total, z_total = (torch.zeros((), dtype=torch.float32, device=weight.device) for _ in range(2))
    kernels = triton_kernels(weight.device)  # (on a GPU's first call: Triton takes seconds to import)
    chunk = _chunk if kernels is None else functools.partial(_chunk_kernels, kernels)
    with torch.autocast(weight.device.type, enabled=False):
        for start in range(0, labels.shape[0], rows):
            part = lambda t: t if t is None else t[start : start + rows]
            loss, z = chunk(part(log_prior).float(), part(latents).to(dtype), weight, bias, part(labels), ignore_index,
                            [part(g) for g in grads[:2]] + grads[2:], sigsoftmax, softcap, z_loss)
            total += loss
            z_total += z
    return (total, z_total), grads


class FusedMixtureNLL(torch.autograd.Function):
    """`fused_mixture_nll` under autograd: the gradients are computed in forward; backward scales
    them in place by the upstream gradient (no second copy) and casts them to the inputs' dtypes.
    They are used up by that backward: a second backward through the same graph raises.
    `transform`: `(softcap, z_loss)` (none: 0, 0); with a z-loss its part of the loss is a second
    output, without gradient (as Liger's `return_z_loss`)."""

    @staticmethod
    def forward(ctx, log_prior, latents, weight, bias, labels, ignore_index, rows, dtype, sigsoftmax, *transform):
        softcap, z_loss = transform or (0.0, 0.0)
        (total, z), ctx.grads = fused_mixture_nll(log_prior, latents, weight, bias, labels, ignore_index, rows,
                                                  ctx.needs_input_grad[:4], dtype, sigsoftmax, softcap, z_loss)
        ctx.dtypes = [None if t is None else t.dtype for t in (log_prior, latents, weight, bias)]
        ctx.other_inputs = 5 + len(transform)
        if not z_loss:
            return total
        ctx.mark_non_differentiable(z)
        return total, z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, *_):
        if ctx.grads is None:
            raise RuntimeError("The fused mixture loss computes its gradients in forward and hands them over in "
                               "its first backward; run the forward again instead of a second backward.")
        grads, ctx.grads = ctx.grads, None
        grads = [None if g is None else g.mul_(grad).to(dtype) for g, dtype in zip(grads, ctx.dtypes)]
        return (*grads, *[None] * ctx.other_inputs)


@torch.compiler.disable  # under torch.compile: eager (module docstring)
def mixture_nll_sum(log_prior, latents, weight, bias, labels, *, ignore_index=IGNORE_INDEX, chunk_rows=None,
                    sigsoftmax=False, softcap=0.0, z_loss=0.0, return_z_loss=False):
    """Exact `-sum_i logsumexp_j(log_prior_ij + log_softmax(latents_ij W^T + b)[y_i])`, fp32
    scalar, over the labels `!= ignore_index` (an all-ignored batch gives 0 and zero gradients).

    `log_prior (..., K)` may be any additive log-weights (`lightrnn` adds its second code's
    log-probability), `latents (..., K, d)`, `weight (|V|, d)` (the input embeddings when tied:
    their gradient flows as any input's), `bias (|V|,)` or None, `labels (...)`. Inputs in any
    float dtype (gradients returned in the inputs' dtypes); matrix products in `matmul_dtype`
    (bf16 under bf16 autocast or with bf16 weights, else fp32), softmax statistics in fp32. Eager:
    the fused `FusedMixtureNLL` over chunks of `chunk_rows` rows (default: `fused_chunk_rows`);
    traced (torch.export, torch.compile): one plain computation over all rows. `sigsoftmax`: the
    components are sigsoftmaxes of the scores instead of softmaxes; `softcap`: of each component's
    soft-capped scores (`logit_transforms`); `z_loss` (one component only): the loss also counts
    `z_loss * log(Z)^2` per kept row, and with `return_z_loss` the result is `(loss, z)`, `z` that
    part without gradient (Liger-Kernel's convention)."""
    K, d = latents.shape[-2:]
    if z_loss and K != 1:
        raise ValueError(f"The z-loss is defined for one softmax, not a mixture of {K}.")
    log_prior, latents, labels = log_prior.reshape(-1, K), latents.reshape(-1, K, d), labels.reshape(-1)
    if is_traced():  # all rows at once, plain autograd
        bias = None if bias is None else bias.float()
        total, z = _chunk(log_prior.float(), latents.float(), weight.float(), bias, labels, ignore_index,
                          sigsoftmax=sigsoftmax, softcap=softcap, z_loss=z_loss)
        return (total, torch.as_tensor(z, device=total.device).detach()) if return_z_loss else total
    rows = chunk_rows or fused_chunk_rows(weight.shape[0], K, weight.device)
    tensors, dtype = (log_prior, latents, weight, bias), matmul_dtype(weight)
    if grad_needed(*tensors):
        out = FusedMixtureNLL.apply(*tensors, labels, ignore_index, rows, dtype, sigsoftmax, softcap, z_loss)
        total, z = out if z_loss else (out, torch.zeros_like(out).detach())
    else:
        (total, z), _ = fused_mixture_nll(*tensors, labels, ignore_index, rows, dtype=dtype, sigsoftmax=sigsoftmax,
                                          softcap=softcap, z_loss=z_loss)
    return (total, z) if return_z_loss else total


def _naive(input, weight, target, bias, ignore_index, softcap=0.0):
    scores = softcap_scores(F.linear(input, weight, bias), softcap)
    return F.cross_entropy(scores, target, ignore_index=ignore_index, reduction="none")


def _chunked(input, weight, target, bias, ignore_index, rows, softcap=0.0):
    """Per-row NLL in row chunks (`over_row_chunks`: each chunk's logits recomputed in backward,
    which a per-row upstream gradient needs): peak one chunk's `rows x |V|`."""
    rows_nll = lambda x, y, w, b: _naive(x, w, y, b, ignore_index, softcap).unsqueeze(-1)
    return over_row_chunks(rows_nll, (input, target), (weight, bias), rows, grad_needed(input, weight, bias), 1)[:, 0]


@torch.compiler.disable  # under torch.compile: eager (module docstring)
def linear_cross_entropy(
    input: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    chunk_rows: int | None = None,
    impl: str = "auto",
    reduction: str = "none",
    softcap: float = 0.0,
    z_loss: float = 0.0,
    return_z_loss: bool = False,
):
    """Per-row `-log_softmax(s)[target]` of the scores `s = input @ weight.T + bias` (soft-capped,
    `cap tanh(s / cap)`, when `softcap` is not 0), shape `target.shape`, in fp32, 0 (and no gradient)
    where `target == ignore_index`; `reduction="sum"`: their sum, with the gradient computed in the
    forward pass (nothing recomputed in backward) by "own", Liger and CCE, plus `z_loss * log(Z)^2`
    per kept row (PaLM's z-loss; "sum" only); with `return_z_loss`, `(loss, z)`, `z` that part without
    gradient (Liger-Kernel's convention; None when `z_loss` is 0).

    `input` is `(..., d)`, `weight` `(|V|, d)`, `bias` `(|V|,)`. `impl`:
      - "auto": for "sum", `loss_kernels.fastest_kernel` (the fastest kernel installed for the device
        and |V| that computes the soft cap and z-loss asked for, as measured); for "none", "torch"
        when the installed torch has it and no soft cap is asked for, else "own";
      - "own": for "none", plain autograd with `torch.utils.checkpoint` per row chunk (fp32); for
        "sum", `mixture_nll_sum` with one component (products in `matmul_dtype`: bf16 under autocast);
      - "liger", "cce" ("sum" only): the peers' kernels (`loss_kernels`), products in `matmul_dtype`;
      - "torch": `F.linear_cross_entropy(..., options=LinearCrossEntropyOptions(batch_chunk_size=
        chunk_rows))` in fp32, which recomputes each chunk's logits in backward for "none" only;
      - "naive": full logits in fp32 (reference for tests).
    A kernel that takes no soft cap or z-loss (`loss_kernels.FEATURES`) is refused when they are asked for.
    `chunk_rows` defaults to `default_chunk_rows(|V|)` (about 128 MB of logits per chunk).
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl={impl!r} is not one of {list(IMPLEMENTATIONS)}.")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not one of {list(REDUCTIONS)}.")
    if z_loss and reduction != "sum":
        raise ValueError("z_loss is a term of the summed training loss: pass reduction='sum'.")
    shape = target.shape
    input, target = input.reshape(-1, input.shape[-1]), target.reshape(-1)
    if input.shape[0] != target.shape[0]:
        raise ValueError(f"{input.shape[0]} input rows but {target.shape[0]} targets.")
    rows, needs = chunk_rows or default_chunk_rows(weight.shape[0]), needed_features(softcap, z_loss)
    if impl == "auto":
        impl = fastest_kernel(input.device.type, weight.shape[0], needs) if reduction == "sum" else (
            "torch" if has_torch_linear_cross_entropy() and not softcap else "own")
    if impl in ("liger", "cce") and reduction != "sum":
        raise ValueError(f"impl={impl!r} computes reduction='sum' only.")
    if impl in PEER_KERNELS and unsupported(impl, needs):
        raise ValueError(f"impl={impl!r} cannot compute this loss: {unsupported(impl, needs)}. Use impl='auto' or 'own'.")
    if impl == "own" and reduction == "sum":
        zeros = input.new_zeros(input.shape[0], 1, dtype=torch.float32)
        total, z = mixture_nll_sum(zeros, input.unsqueeze(1), weight, bias, target, ignore_index=ignore_index,
                                   chunk_rows=chunk_rows, softcap=softcap, z_loss=z_loss, return_z_loss=True)
        return (total, z if z_loss else None) if return_z_loss else total
    if input.shape[0] == 0:
        empty = input.float().sum() if reduction == "sum" else input.float().sum(-1).reshape(shape)  # attached to the graph
        return (empty, empty.detach() if z_loss else None) if return_z_loss else empty
    if impl in PEER_KERNELS and reduction == "sum":
        total, z = peer_nll_sum(impl, input, weight, target, bias, ignore_index, matmul_dtype(weight), softcap, z_loss)
        return (total, z) if return_z_loss else total
    input, weight, bias = input.float(), weight.float(), (bias.float() if bias is not None else None)
    if impl == "naive":
        nll = _naive(input, weight, target, bias, ignore_index, softcap)
    elif impl == "own":
        nll = _chunked(input, weight, target, bias, ignore_index, rows, softcap)
    else:
        options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=rows, chunking_method=None)
        nll = F.linear_cross_entropy(input, weight, target, linear_bias=bias, reduction=reduction,
                                     ignore_index=ignore_index, options=options)
    if reduction == "none":
        return nll.reshape(shape)
    total, z = nll.sum(), None
    if z_loss:  # (the naive path: the full scores once more)
        z = z_loss_sum(softcap_scores(F.linear(input, weight, bias), softcap), target, z_loss)
        total = total + z
    return (total, None if z is None else z.detach()) if return_z_loss else total
