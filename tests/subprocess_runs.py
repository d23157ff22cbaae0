"""`run`: `subprocess.run` for the tests' script and `accelerate launch` runs. On a timeout it
asks every process of the run (launcher, agent and workers, which torchrun starts in sessions
of their own; all run with faulthandler on) for its Python stacks with SIGABRT, kills them,
and fails with those stacks: a hang says where it is, and leaves no worker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run(command, *, env=None, timeout=300, cwd=None, grace=5.0) -> subprocess.CompletedProcess:
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [process.pid, *descendants(process.pid)]
        signal_all(tree[::-1], signal.SIGABRT)  # faulthandler prints each Python thread's stack
        time.sleep(grace)
        signal_all(tree, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{' '.join(map(str, command))} still ran after {timeout} s; its output and stacks:\n"
                    f"{stdout[-3000:]}\n{stderr[-12000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
