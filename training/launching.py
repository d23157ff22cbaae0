"""Several processes on any machine: what `accelerate launch` asked for against what started.

On a CPU-only machine, `accelerate launch --multi_gpu --num_processes 2 -m training.train ...`
starts two processes (torchrun); `force_cpu` makes them form one CPU (gloo) process group
instead of two independent one-process runs. Without `--multi_gpu`, accelerate's simple
launcher starts one process whatever `--num_processes` says: `check_process_count` warns.
"""

from __future__ import annotations

import os
import re
import warnings

import torch

LAUNCH_HELP = ("On a CPU-only machine start several processes with "
               "`accelerate launch --multi_gpu --num_processes N -m training.train ...` (see training/README.md).")


def force_cpu() -> bool:
    """True when a multi-process launch (WORLD_SIZE > 1) runs on a machine without accelerator."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    accelerator = getattr(torch, "accelerator", None)
    return not (accelerator.is_available() if accelerator is not None else torch.cuda.is_available())


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
