"""The CUDA side of `bench_heads.py --device cuda`: event timing, allocator peak memory, and the
plain head's fused loss against its peers.

The peers of `hf_outheads.losses.linear_cross_entropy(impl="chunked", reduction="sum")` (the
package's fused loss of one softmax, gradient computed in forward, bf16 products on bf16
inputs), each measured for forward + backward of the summed loss of `x (N, d)` and `W (|V|, d)`,
both bf16:
  - `torch`: torch's own `F.linear_cross_entropy` (torch >= 2.13);
  - `liger`: Liger-Kernel's `LigerFusedLinearCrossEntropyLoss` (Triton);
  - `cce`: Apple's cut-cross-entropy `linear_cross_entropy` (Triton);
  - `naive`: `F.cross_entropy` of the full logits taken to fp32 (what the `full` training loss does).
A peer whose package is not installed is listed with a note instead of figures.
"""

from __future__ import annotations

import statistics


def cuda_device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here.")
    return torch.cuda.get_device_name()


def cuda_clock(call) -> float:
    """Seconds of `call()` on the current CUDA stream, from events (the host does not wait
    between the two records)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def peak_mb(call) -> tuple[float, float]:
    """(peak allocated during `call()` above what was allocated before, absolute peak), MB."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return (peak - before) / 2**20, peak / 2**20


def loss_peers() -> dict:
    """name -> `loss(x, W, y)` (summed NLL, fp32 or bf16 scalar), or a string saying why not."""
    import torch
    import torch.nn.functional as F

    from hf_outheads import losses

    peers = {
        "hf_outheads": lambda x, w, y: losses.linear_cross_entropy(x, w, y, impl="chunked", reduction="sum"),
        "naive": lambda x, w, y: F.cross_entropy(F.linear(x, w).float(), y, reduction="sum"),
    }
    if losses.has_torch_linear_cross_entropy():
        peers["torch"] = lambda x, w, y: F.linear_cross_entropy(x, w, y, reduction="sum")
    else:
        peers["torch"] = f"torch {torch.__version__} has no F.linear_cross_entropy"
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss(reduction="sum")
        peers["liger"] = lambda x, w, y: liger(w, x, y)
    except ImportError:
        peers["liger"] = "liger-kernel not installed (pip install liger-kernel)"
    try:
        from cut_cross_entropy import linear_cross_entropy as cce

        peers["cce"] = lambda x, w, y: cce(x, w, y, reduction="sum")
    except ImportError:
        peers["cce"] = "cut-cross-entropy not installed (pip install cut-cross-entropy)"
    return peers


def measure_loss(loss, vocab: int, positions: int, dim: int, reps: int) -> dict:
    """Median forward + backward seconds, step memory above the inputs, the loss value."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(positions, dim, device="cuda", generator=g) * dim**-0.5).bfloat16().requires_grad_()
    w = (torch.randn(vocab, dim, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
    y = torch.randint(0, vocab, (positions,), device="cuda", generator=g)

    def step():
        x.grad = w.grad = None
        value = loss(x, w, y)
        value.backward()
        return value

    value = step()  # warm-up (Triton compilation, allocator)
    x.grad = w.grad = None
    step_mb, _ = peak_mb(step)
    times = [cuda_clock(step) for _ in range(reps)]
    return {"time_s": statistics.median(times), "mem_mb": step_mb, "loss": float(value.detach())}


def loss_rows(vocab: int, positions: int, dim: int, reps: int) -> list[str]:
    """Markdown rows: each peer's time and memory, as ratios to the fastest and the leanest."""
    import torch

    results = {}
    for name, loss in loss_peers().items():
        if isinstance(loss, str):
            results[name] = {"note": loss}
            continue
        try:
            results[name] = measure_loss(loss, vocab, positions, dim, reps)
        except Exception as error:  # an unsupported shape or dtype: say so in the table
            results[name] = {"note": f"error: {type(error).__name__}: {str(error)[:100]}"}
        torch.cuda.empty_cache()
    timed = {name: r for name, r in results.items() if "time_s" in r}
    fastest = min((r["time_s"] for name, r in timed.items() if name != "hf_outheads"), default=None)
    leanest = min((r["mem_mb"] for name, r in timed.items() if name != "hf_outheads"), default=None)
    reference = timed.get("naive", {}).get("loss")
    rows = []
    for name, r in results.items():
        if "note" in r:
            rows.append(f"| {vocab} | {positions} | {name} | {r['note']} | | | | |")
            continue
        ratio = lambda value, base: f"{value / base:.2f}x" if base else "-"
        error = f"{abs(r['loss'] - reference) / abs(reference):.1e}" if reference else "-"
        rows.append(f"| {vocab} | {positions} | {name} | {r['time_s'] * 1e3:.1f} | {ratio(r['time_s'], fastest)} | "
                    f"{r['mem_mb']:.0f} | {ratio(r['mem_mb'], leanest)} | {error} |")
    return rows


def loss_table(vocabs: str, positions: str, dim: int, reps: int) -> list[str]:
    """The comparison's markdown table over the comma-separated sizes, printed as it grows."""
    lines = LOSS_HEADER[:]
    print("\n" + "\n".join(lines), flush=True)
    for vocab in map(int, vocabs.split(",")):
        for count in map(int, positions.split(",")):
            rows = loss_rows(vocab, count, dim, reps)
            print("\n".join(rows), flush=True)
            lines += rows
    return lines


LOSS_HEADER = ["| V | N | loss | fwd+bwd ms | vs fastest peer | mem MB | vs leanest peer | rel. diff vs naive |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
