"""What a GPU can do, measured: the dense bf16 rate that achieved FLOP rates are read against (MFU),
and the event clock it is timed with; and what a training run achieved (`training_rates`: tokens/s,
FLOP/s and MFU, logged by every run of `hf_outheads/training/train.py`). Also used by the benchmarks
(`benchmarks/bench_gpu.py`) and the GPU scripts (`maintainer/gpu_run.sh`)."""

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


def device_name(device) -> str:
    """The card's name (`torch.cuda.get_device_name`), or the device type ("cpu")."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def training_rates(step_times: list[float], warm_steps: int, flops_per_step: float, tokens_per_step: int, device,
                   processes: int = 1) -> dict:
    """What the optimizer steps of a run achieved, from their wall times (`loop.train_loop`): the
    steps after the first `warm_steps` (compilation, the first batches; left out of the rates when
    the run has more than twice as many, else only the first step is, when there is another) at their mean time, not a median:
    the host runs ahead of the device and waits for it at a read, so a single step's time is not its
    device time, but their sum is. `flops_per_step` and `tokens_per_step` count every process's; the MFU
    is the achieved rate against the measured dense bf16 peak (`peak_tflops`) of each process's device
    (None on a CPU)."""
    warm = warm_steps if len(step_times) > 2 * warm_steps else min(1, max(len(step_times) - 1, 0))
    steady = step_times[warm:]
    step_s = sum(steady) / len(steady) if steady and sum(steady) > 0 else None
    peak = peak_tflops(device.type)
    achieved = flops_per_step / step_s / 1e12 if step_s else None
    return {"train_seconds": sum(step_times), "first_step_s": step_times[0] if step_times else None,
            "warm_up_steps": warm, "warm_up_s": sum(step_times[:warm]), "train_step_time_s": step_s,
            "tokens_per_s": tokens_per_step / step_s if step_s else None, "achieved_tflops": achieved,
            "peak_tflops": peak, "mfu": achieved / (peak * processes) if achieved and peak else None,
            "device": device_name(device)}
