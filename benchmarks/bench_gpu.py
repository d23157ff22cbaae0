"""The benchmarks' wall clock (`cpu_clock`; the CUDA event clock and the bf16 peak are
`hf_outheads.training.throughput`'s) and
the CUDA side of `bench_heads.py --device cuda`: allocator peak memory, and the plain head's fused
loss against its peers.

The package's summed loss of one softmax, `hf_outheads.losses.linear_cross_entropy(..., reduction=
"sum")`, as a head trains with it (`impl="auto"`: the kernel `loss_kernels.KERNEL_ORDER` picks, named
in the row) and on its own kernels (`impl="own"`: gradient computed in forward, the `|V|`-wide work
in `softmax_kernels`), against its peers, each measured for forward + backward of the summed loss
of `x (N, d)` and `W (|V|, d)`, both bf16:
  - `torch`: torch's own `F.linear_cross_entropy` (torch >= 2.13);
  - `liger`: Liger-Kernel's `LigerFusedLinearCrossEntropyLoss` (Triton);
  - `cce`: Apple's cut-cross-entropy `linear_cross_entropy` (Triton);
  - `naive`: `F.cross_entropy` of the full logits taken to fp32 (what the `full` training loss does).
A peer whose package is not installed is listed with a note instead of figures.

    python -m benchmarks.bench_gpu --vocab 32000,128000 --positions 8192,16384   # the loss comparison alone
"""

from __future__ import annotations

import statistics
import sys
import time

from hf_outheads.training.throughput import cuda_clock


def cuda_device_name() -> str:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here.")
    return torch.cuda.get_device_name()


def cpu_clock(call) -> float:
    """Seconds of `call()` by the wall clock."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


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


def own_with_chunk(elements: int):
    """The own kernels' loss with `losses.FUSED_CHUNK_ELEMENTS_CUDA = elements` for the call (their
    gradients are computed in the forward, so the call covers the whole chunk loop)."""
    from hf_outheads import losses

    def loss(x, w, y):
        saved, losses.FUSED_CHUNK_ELEMENTS_CUDA = losses.FUSED_CHUNK_ELEMENTS_CUDA, elements
        try:
            return losses.linear_cross_entropy(x, w, y, impl="own", reduction="sum")
        finally:
            losses.FUSED_CHUNK_ELEMENTS_CUDA = saved
    return loss


def loss_peers(vocab: int, device: str, own_chunks: tuple[int, ...] = ()) -> dict:
    """name -> `loss(x, W, y)` (summed NLL, fp32 or bf16 scalar), or a string saying why not; the
    package's rows first (`hf_outheads (auto: <kernel>)`, `hf_outheads own`, and the own kernels at
    each scores-per-chunk exponent of `own_chunks`: `hf_outheads own, chunk 2^e`)."""
    import torch
    import torch.nn.functional as F

    from hf_outheads import losses, loss_kernels

    auto = loss_kernels.fastest_kernel(device, vocab)
    peers = {
        f"hf_outheads (auto: {auto})": lambda x, w, y: losses.linear_cross_entropy(x, w, y, impl="auto", reduction="sum"),
        "hf_outheads own": lambda x, w, y: losses.linear_cross_entropy(x, w, y, impl="own", reduction="sum"),
        **{f"hf_outheads own, chunk 2^{e}": own_with_chunk(2**e) for e in own_chunks},
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


def measure_loss(loss, vocab: int, positions: int, dim: int, reps: int, device: str = "cuda") -> dict:
    """Median forward + backward seconds, step memory above the inputs (CUDA only), the loss value."""
    import torch

    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the CPU (`gpu_run.sh --tiny`) checks the wiring
    x = (torch.randn(positions, dim, device=device, generator=g) * dim**-0.5).to(dtype).requires_grad_()
    w = (torch.randn(vocab, dim, device=device, generator=g) * 0.02).to(dtype).requires_grad_()
    y = torch.randint(0, vocab, (positions,), device=device, generator=g)

    def step():
        x.grad = w.grad = None
        value = loss(x, w, y)
        value.backward()
        return value

    value = step()  # warm-up (Triton compilation, allocator)
    x.grad = w.grad = None
    if device == "cuda":
        step_mb, clock = peak_mb(step)[0], cuda_clock
    else:
        clock = cpu_clock
        step_mb = float("nan")
    times = [clock(step) for _ in range(reps)]
    return {"time_s": statistics.median(times), "mem_mb": step_mb, "loss": float(value.detach())}


def loss_rows(vocab: int, positions: int, dim: int, reps: int, device: str = "cuda", own_chunks=()) -> list[str]:
    """Markdown rows: each peer's time and memory, as ratios to the fastest and the leanest."""
    import torch

    results = {}
    for name, loss in loss_peers(vocab, device, own_chunks).items():
        if isinstance(loss, str):
            results[name] = {"note": loss}
            continue
        try:
            results[name] = measure_loss(loss, vocab, positions, dim, reps, device)
        except Exception as error:  # an unsupported shape or dtype: say so in the table
            results[name] = {"note": f"error: {type(error).__name__}: {str(error)[:100]}"}
        if device == "cuda":
            torch.cuda.empty_cache()
    timed = {name: r for name, r in results.items() if "time_s" in r}
    peers = {name: r for name, r in timed.items() if not name.startswith("hf_outheads")}
    fastest = min((r["time_s"] for r in peers.values()), default=None)
    leanest = min((r["mem_mb"] for r in peers.values()), default=None)
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
    kernels = {"hf_outheads own": "own", "torch": "torch", "liger": "liger", "cce": "cce"}
    order = sorted((r["time_s"], kernels[name]) for name, r in timed.items() if name in kernels)
    rows.append(f"<!-- |V| = {vocab}, N = {positions}: kernels fastest first: {', '.join(k for _, k in order)} "
                "(loss_kernels.KERNEL_ORDER) -->")
    return rows


def loss_table(vocabs: str, positions: str, dim: int, reps: int, device: str = "cuda", own_chunks=()) -> list[str]:
    """The comparison's markdown table over the comma-separated sizes, printed as it grows."""
    lines = LOSS_HEADER[:]
    print("\n" + "\n".join(lines), flush=True)
    for vocab in map(int, vocabs.split(",")):
        for count in map(int, positions.split(",")):
            rows = loss_rows(vocab, count, dim, reps, device, own_chunks)
            print("\n".join(rows), flush=True)
            lines += rows
    return lines


LOSS_HEADER = ["| V | N | loss | fwd+bwd ms | vs fastest peer | mem MB | vs leanest peer | rel. diff vs naive |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]


def main(argv=None):
    """The loss comparison alone: `python -m benchmarks.bench_gpu --vocab 32000,128000 --positions 8192,16384`."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--vocab", default="32000,128000", help="comma-separated vocabulary sizes")
    parser.add_argument("--positions", default="8192,16384", help="comma-separated N")
    parser.add_argument("--dim", type=int, default=2048, help="d of x and W")
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions (median reported)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: fp32, no memory figures (checks the wiring, e.g. `gpu_run.sh --tiny`)")
    parser.add_argument("--own_chunk_exponents", default="",
                        help="comma-separated e: also the own kernels at 2^e scores per chunk (the CUDA default: "
                             "losses.FUSED_CHUNK_ELEMENTS_CUDA), to choose that size by time and memory")
    parser.add_argument("--out", help="also write the markdown table to this file")
    args = parser.parse_args(argv)
    own_chunks = tuple(int(e) for e in args.own_chunk_exponents.split(",") if e)
    import torch

    where = cuda_device_name() if args.device == "cuda" else "cpu, fp32"
    lines = [f"<!-- python -m benchmarks.bench_gpu {' '.join(sys.argv[1:] if argv is None else argv)}; {where}; "
             f"torch {torch.__version__} -->",
             *loss_table(args.vocab, args.positions, args.dim, args.reps, args.device, own_chunks)]
    if args.out:
        with open(args.out, "w") as out:
            out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
