"""Several processes on any machine: what `accelerate launch` asked for against what started.

On a CPU-only machine, `accelerate launch --multi_gpu --num_processes 2 hf_outheads/training/train.py ...`
starts two processes (torchrun); `force_cpu` makes them form one CPU (gloo) process group
instead of two independent one-process runs. Without `--multi_gpu`, accelerate's simple
launcher starts one process whatever `--num_processes` says: `check_process_count` warns.

A launch whose accelerate config asks for sharding (`distributed_type: FSDP` or `DEEPSPEED`,
which `accelerate launch` passes on as ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED) shards or
stops (`check_sharding`): never a silent unsharded run. DeepSpeed runs on a CPU-only machine
(its CPU accelerator, a gloo process group: `accelerator_settings`); accelerate runs FSDP on
accelerators only.
"""

from __future__ import annotations

import os
import re
import warnings

from hf_outheads.tools import command_line
from hf_outheads.tools.command_line import program, refuse

LAUNCH_HELP = ("On a CPU-only machine start several processes with "
               "`accelerate launch --multi_gpu --num_processes N hf_outheads/training/train.py ...` (see training/README.md).")


def first_process() -> bool:
    """True in the launch's first process (RANK 0, or a run without launcher): the one that says why a
    run stops, so that a launch of N processes says it once."""
    return os.environ.get("RANK", "0") == "0"


def refusal(error, status: int = 2) -> SystemExit:
    """The exit of a run that cannot go on, which every process of a launch meets alike: one line on
    stderr from the launch's first process, so a launch of N processes says it once, with status 2
    (`command_line.refuse`: nothing was done) or, for a run that failed while training, 1. The
    others end silently with status 0: torchrun ends every worker at the first failure, and a
    failing peer could end the first process before it has said why; the launch fails with it."""
    if not first_process():
        return SystemExit(0)
    message = f"{program('train.py')}: error: {error}"
    return refuse(message) if status == 2 else SystemExit(message)


def has_accelerator() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def force_cpu() -> bool:
    """True when a multi-process launch (WORLD_SIZE > 1) runs on a machine without accelerator."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and not has_accelerator()


def requested_sharding() -> str | None:
    """"FSDP" or "DeepSpeed" when the accelerate config of the launch asks for it, else None."""
    for name, variable in (("FSDP", "ACCELERATE_USE_FSDP"), ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED")):
        if os.environ.get(variable, "false").lower() in ("1", "true", "yes"):
            return name
    return None


def quiet_deepspeed_cpu_notice() -> None:
    """DeepSpeed's CPU notice dropped (`command_line.quiet_deepspeed_cpu_notice`) unless the launch asks for
    DeepSpeed. Called when `training` is imported."""
    command_line.quiet_deepspeed_cpu_notice(deepspeed_used=requested_sharding() == "DeepSpeed")


def run_precision(own: str | None, launch: str | None) -> str:
    """The mixed precision a run trains with: its own `mixed_precision` when it sets one, else the launch's
    (`accelerate launch --mixed_precision`, or its accelerate config's), else 'no'."""
    return own or (launch or "no").lower()


def with_launch_precision(options) -> tuple:
    """(`options` with the mixed precision the run trains with, a line saying which won or None). The run's
    own `mixed_precision` when it sets one; else the launch's (`accelerate launch --mixed_precision`, or the
    accelerate config's, which the launcher passes on as ACCELERATE_MIXED_PRECISION), else 'no'. Where both
    are set and differ, the run's wins and the line says so."""
    from dataclasses import replace

    launch, own = os.environ.get("ACCELERATE_MIXED_PRECISION"), options.training.mixed_precision
    if own is None:
        return replace(options, training=replace(options.training, mixed_precision=run_precision(own, launch))), None
    if launch and launch.lower() != own:
        return options, f"mixed_precision: this run's option ({own}) is used, not the launch's ({launch}, " \
                        "ACCELERATE_MIXED_PRECISION)."
    return options, None


def accelerator_settings() -> dict:
    """Keyword arguments for `Accelerator`: a CPU process group for several processes on a
    CPU-only machine (`force_cpu`), except under DeepSpeed, which runs there itself (its CPU
    accelerator) in a gloo process group that accelerate must be told to create."""
    from accelerate.utils import InitProcessGroupKwargs

    if requested_sharding() == "DeepSpeed" and not has_accelerator():
        return {"cpu": False, "kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    return {"cpu": force_cpu()}


def check_sharding(accelerator=None) -> None:
    """Stop (a ValueError saying why and what to do) when the launch asked for FSDP or DeepSpeed
    and the Accelerator does not shard with it. Without an Accelerator (`preflight.check_run`, before
    anything is created or written), what the launch alone shows: FSDP on a machine without accelerator."""
    requested = requested_sharding()
    if accelerator is None:
        if requested != "FSDP" or has_accelerator():
            return
        running = None
    else:
        running = {"FSDP": "FSDP", "DEEPSPEED": "DeepSpeed"}.get(accelerator.distributed_type.name)
    if requested is None or running == requested:
        return
    why = ("accelerate runs FSDP on GPUs (or other accelerators) only: on a machine without one it would train "
           "every process unsharded" if requested == "FSDP" and not has_accelerator() else
           f"the Accelerator set itself up as {accelerator.distributed_type.name} instead")
    raise ValueError(
        f"The accelerate config asks for {requested} sharding, but {why}. Nothing was trained. Run the launch on a "
        "machine with GPUs; on a CPU-only machine use DeepSpeed (training/accelerate_zero3.yaml, `pip install "
        "'hf_outheads[deepspeed]'`, DS_ACCELERATOR=cpu) or unsharded data parallelism (`accelerate launch --multi_gpu "
        "--num_processes N hf_outheads/training/train.py ...`). See training/README.md, \"Sharded training\".")


def launcher_command_line() -> list[str]:
    """The command line of the parent process (`accelerate launch ...`), or [] if unknown."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def requested_processes(command: list[str] | None = None) -> int | None:
    """Processes the launch asked for: WORLD_SIZE (torchrun and accelerate's multi-process
    launchers), else `--num_processes N` on the parent `accelerate launch` command line."""
    if os.environ.get("WORLD_SIZE"):
        return int(os.environ["WORLD_SIZE"])
    command = launcher_command_line() if command is None else command
    if not any("accelerate" in part for part in command[:3]) or "launch" not in " ".join(command):
        return None
    for index, part in enumerate(command):
        match = re.fullmatch(r"--num[_-]processes(?:=(\d+))?", part)
        if match:
            value = match.group(1) or (command[index + 1] if index + 1 < len(command) else "")
            return int(value) if value.isdigit() else None
    return None


def check_process_count(accelerator, requested: int | None = None) -> None:
    """Warn (on stderr) when fewer processes run than the launch asked for."""
    requested = requested_processes() if requested is None else requested
    if requested is not None and requested > accelerator.num_processes:
        message = (f"The launch asked for {requested} processes but this run has {accelerator.num_processes}: "
                   f"training goes on with {accelerator.num_processes}. {LAUNCH_HELP}")
        if accelerator.is_main_process:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
