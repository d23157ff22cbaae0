"""Which kernel computes a fused loss: the package's own Triton kernels where they can run
(`use_triton`, `softmax_kernels`), and the summed linear cross-entropy `sum_i -log softmax(x_i W^T +
b)[y_i]` by the GPU kernels the field already trusts, with the choice among them
(`losses.linear_cross_entropy`, `impl="auto"`):

  - "liger": Liger-Kernel's fused linear cross-entropy (BSD-2-Clause; `pip install liger-kernel`):
    chunks of rows, the gradient computed in the forward pass;
  - "cce": Apple's cut-cross-entropy (Apple's own licence, see its LICENSE; `pip install
    cut-cross-entropy`): the scores never leave the chip (an online log-sum-exp per tile), the
    backward recomputes them and skips gradient entries below bf16 resolution (its default
    filtering). It takes no bias: `b` is folded into the product as one more column
    (`[x, 1] [W, b]^T`, padded to a multiple of 8 columns);
  - "torch": torch's own `F.linear_cross_entropy` (torch >= 2.13), in fp32;
  - "own": the package's fused loss (`losses.mixture_nll_sum` with one component).

A soft cap on the scores and a z-loss (`logit_transforms`) run inside the kernels that take them
(`FEATURES`: the own, Liger's; CCE takes a soft cap only, torch's neither); "auto" picks the
fastest kernel that takes what the loss asks for.

`pip install "hf_outheads[gpu]"` installs the first two. `KERNEL_ORDER` lists, per device type
and vocabulary size, the kernels fastest first, as measured (`benchmarks/bench_gpu.py`, the
results in `benchmarks/README.md`); the first one installed is used.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

PEER_KERNELS = ("liger", "cce", "torch")
# device type -> ((largest |V| the row applies to, None: any), kernels, first choice first). CUDA: from the
# comparison on one NVIDIA H100 80GB HBM3 (benchmarks/results/h100/loss.md; benchmarks/README.md): Liger the
# fastest peer at 32K, CCE at 128K; the own kernels as fast or faster but with 3-3.6x the leanest peer's memory, so
# after the peers; torch's F.linear_cross_entropy not measured on a GPU (torch 2.11 there has none). CPU: torch's.
KERNEL_ORDER: dict[str, tuple[tuple[int | None, tuple[str, ...]], ...]] = {
    "cuda": ((65536, ("liger", "cce", "own", "torch")), (None, ("cce", "liger", "own", "torch"))),
    "cpu": ((None, ("torch", "own")),),
}
MODULES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}
# what each kernel computes besides the plain loss: "softcap" (`cap tanh(s / cap)` on the scores, the
# kernels' `softcap` argument), "z_loss" (`c log(Z)^2` per row: Liger's `lse_square_scale`)
FEATURES = {"own": ("softcap", "z_loss"), "liger": ("softcap", "z_loss"), "cce": ("softcap",), "torch": ()}


def needed_features(softcap: float, z_loss: float) -> tuple[str, ...]:
    return tuple(name for name, value in (("softcap", softcap), ("z_loss", z_loss)) if value)


def unsupported(kernel: str, needs: tuple[str, ...]) -> str | None:
    """Why `kernel` cannot compute a loss that needs `needs` (`FEATURES`), or None when it can."""
    missing = [need for need in needs if need not in FEATURES[kernel]]
    return f"the loss kernel {kernel!r} takes no {' and no '.join(missing)}" if missing else None


@functools.cache
def installed(module: str) -> bool:
    """Whether `module` can be imported (looked up once: a lookup costs about 0.1 ms, a step calls it)."""
    return importlib.util.find_spec(module) is not None


def use_triton(device: torch.device) -> bool:
    """Whether the package's fused loss runs its `|V|`-wide work as Triton kernels
    (`softmax_kernels`): on a CUDA device when Triton is installed (it comes with torch's CUDA builds)."""
    return device.type == "cuda" and installed("triton")


def own_path(device: torch.device) -> str:
    """How the package's fused loss runs on `device`, in words (recorded beside measured runs)."""
    return "own fused loss" + (" (Triton kernels)" if use_triton(device) else "")


def unavailable(kernel: str, device_type: str) -> str | None:
    """Why `kernel` cannot run on `device_type` here, or None when it can."""
    if kernel == "torch":
        has = hasattr(torch.nn.functional, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
        return None if has else f"torch {torch.__version__} has no F.linear_cross_entropy (torch >= 2.13 has)"
    if kernel in MODULES:
        if not installed(MODULES[kernel]):
            return f"{MODULES[kernel].replace('_', '-')} is not installed (pip install \"hf_outheads[gpu]\")"
        if kernel == "liger" and device_type != "cuda":  # (CCE has a reference path for a CPU)
            return "Liger-Kernel runs on CUDA devices only"
    return None


def fastest_kernel(device_type: str, vocab_size: int, needs: tuple[str, ...] = ()) -> str:
    """The first kernel of `KERNEL_ORDER` installed for this device type and vocabulary size that
    computes what the loss `needs` (`FEATURES`)."""
    rows = KERNEL_ORDER.get(device_type, KERNEL_ORDER["cpu"])
    order = next(kernels for largest, kernels in rows if largest is None or vocab_size <= largest)
    usable = lambda k: unsupported(k, needs) is None and (k == "own" or unavailable(k, device_type) is None)
    return next((k for k in order if usable(k)), "own")


# The peers are imported in `try` blocks: a saved model's remote code copies this file, and transformers
# requires every package a copied file imports outside one.
def _liger(x, weight, target, bias, ignore_index, softcap, z_loss):
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except ImportError as error:
        raise ValueError(f"The loss kernel 'liger' cannot run here: {error}.") from error
    extra = dict(softcap=softcap or None, lse_square_scale=z_loss, return_z_loss=True) if softcap or z_loss else {}
    out = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index, reduction="sum", **extra)(weight, x, target, bias)
    if not extra:
        return out, None
    return (out.loss, out.z_loss) if hasattr(out, "z_loss") else tuple(out)[:2]  # (its loss counts the z-loss)


def _cce(x, weight, target, bias, ignore_index, softcap, z_loss):
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as error:
        raise ValueError(f"The loss kernel 'cce' cannot run here: {error}.") from error

    if bias is not None:  # [x, 1, 0...] [W, b, 0...]^T = x W^T + b
        pad = 8 - weight.shape[1] % 8
        x = torch.cat([x, x.new_ones(x.shape[0], 1), x.new_zeros(x.shape[0], pad - 1)], 1)
        weight = torch.cat([weight, bias.to(weight.dtype).unsqueeze(1), weight.new_zeros(weight.shape[0], pad - 1)], 1)
    impl = "cce" if x.is_cuda else "torch_compile"  # CCE's own reference path on a CPU (the tests)
    return linear_cross_entropy(x, weight, target, ignore_index=ignore_index, softcap=softcap or None, reduction="sum",
                                impl=impl), None


def _torch(x, weight, target, bias, ignore_index, softcap, z_loss):
    return torch.nn.functional.linear_cross_entropy(x.float(), weight.float(), target, linear_bias=(
        None if bias is None else bias.float()), reduction="sum", ignore_index=ignore_index), None


PEERS = {"liger": _liger, "cce": _cce, "torch": _torch}


def peer_nll_sum(kernel: str, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None,
                 ignore_index: int, dtype: torch.dtype, softcap: float = 0.0, z_loss: float = 0.0):
    """`(loss, z)`: the summed NLL of `x (n, d)`, `weight (|V|, d)`, `target (n,)` by a peer's kernel,
    of the scores soft-capped at `softcap` (0: none), plus the z-loss `z` (`z_loss * log(Z)^2` per
    kept row; None without), fp32 scalars, `z` without gradient; its operands in `dtype` (the bias
    too: the peers add it in the products' dtype), autocast off; a ValueError naming the kernel when
    it cannot run here or cannot compute this loss (`FEATURES`)."""
    why = unavailable(kernel, x.device.type) or unsupported(kernel, needed_features(softcap, z_loss))
    if why:
        raise ValueError(f"The loss kernel {kernel!r} cannot compute this loss here: {why}. Use loss_kernel 'auto' "
                         "(the fastest kernel installed that can) or 'own'.")
    if kernel != "torch":
        x, weight, bias = x.to(dtype), weight.to(dtype), (None if bias is None else bias.to(dtype))
    with torch.autocast(x.device.type, enabled=False):
        loss, z = PEERS[kernel](x, weight, target, bias, ignore_index, softcap, z_loss)
    return loss.float(), None if z is None else z.detach().float()
