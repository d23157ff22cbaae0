"""What a GPU can do, measured: the dense bf16 rate that achieved FLOP rates are read against (MFU),
and the event clock it is timed with. Used by the scale study (`studies/scale_heads.py`), the
benchmarks (`benchmarks/bench_gpu.py`) and the GPU scripts (`tools/gpu_run.sh`)."""

from __future__ import annotations

import functools


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


def bf16_peak_tflops(size: int = 8192, reps: int = 10) -> float:
    """The device's dense bf16 rate now, TFLOP/s: a `size`-cubed bf16 matrix product, 3 warm-ups,
    then the mean of `reps` timed products (what the MFU figures divide by; a data sheet's figure
    is higher than such a product measures)."""
    import torch

    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    seconds = cuda_clock(lambda: [a @ b for _ in range(reps)]) / reps
    return 2 * size**3 / seconds / 1e12


@functools.cache
def peak_tflops(device_type: str) -> float | None:
    """The dense bf16 rate of the current device of `device_type`, measured once per process
    (`bf16_peak_tflops`); None on a CPU, which has no such figure here."""
    return bf16_peak_tflops() if device_type == "cuda" else None
