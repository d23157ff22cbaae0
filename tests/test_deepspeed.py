"""DeepSpeed ZeRO-3 (and ZeRO-2) through accelerate on 2 CPU processes (DeepSpeed's CPU
accelerator, gloo): every head (tests/sharded_cases.py) trains to the unsharded run's losses and
weights, built plain or under `deepspeed.zero.Init` (`zero3_init_flag`); gradient accumulation
equals a batch as large; `Trainer` with `TrainingArguments(deepspeed=...)` trains every head
alike; the gathered full weights (`zero3_save_16bit_model`) saved with `save_pretrained` load
back with `from_pretrained`. One torchrun launch (tests/deepspeed_worker.py)
measures it all. Skips without DeepSpeed (the `deepspeed` extra)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from sharded_cases import CASES
from subprocess_runs import run

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without torch.distributed"),
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                       reason="DeepSpeed is not installed (pip install 'hf_outheads[deepspeed]')"),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("deepspeed") / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)]),  # this checkout
           "DS_ACCELERATOR": "cpu", "ACCELERATE_USE_DEEPSPEED": "true"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(HERE / "deepspeed_worker.py"), str(out)]
    done = run(command, env=env, cwd=HERE, timeout=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


def check_run(name: str, result: dict, accumulation: int = 1) -> None:
    assert result["processes"] == 2 and result["distributed_type"] == "DistributedType.DEEPSPEED", (name, result)
    assert result["gradient_accumulation_steps"] == accumulation, (name, result)
    assert result["losses"] == pytest.approx(result["expected_losses"], abs=1e-5), name
    assert len(set(result["losses"])) == len(result["losses"]), f"{name}: the steps changed nothing"
    assert result["weight_diff"] < 1e-5, (name, result["weight_diff"])


@pytest.mark.parametrize("engine", ["zero3", "zero3_init", "zero2"])
def test_deepspeed_trains_every_head_as_unsharded(results, engine):
    assert set(results[engine]) == set(CASES)
    for name, result in results[engine].items():
        check_run(name, result)
        # zero3_init: from_pretrained built the model partitioned (deepspeed.zero.Init), E included
        assert result["partitioned_at_build"] == (engine == "zero3_init"), name


def test_deepspeed_gradient_accumulation_equals_a_larger_batch(results):
    """Two micro-batches per optimizer step (DeepSpeed's accumulation, `accelerator.accumulate`)
    train as the reference's one batch twice as large."""
    assert set(results["zero3_accumulation"]) == {"mos", "tied"}
    for name, result in results["zero3_accumulation"].items():
        check_run(name, result, accumulation=2)


@pytest.mark.parametrize("engine", ["zero3", "zero3_init", "zero3_accumulation", "trainer_zero3"])
def test_zero3_gathered_weights_load_with_from_pretrained(results, engine):
    for name, result in results[engine].items():
        assert result["architectures"] == ["OutHeadsForCausalLM"], name
        assert result["loaded_diff"] < 1e-5, (name, result["loaded_diff"])


def test_trainer_trains_every_head_under_zero3_as_unsharded(results):
    """`Trainer` with `TrainingArguments(deepspeed=...)` (ZeRO-3; SGD, constant rate, batches in
    order): the logged losses and the weights `trainer.save_model` writes equal the reference's."""
    assert set(results["trainer_zero3"]) == set(CASES)
    for name, result in results["trainer_zero3"].items():
        assert result["steps"] == 3, (name, result["steps"])
        check_run(name, result)
        assert result["architectures"] == ["OutHeadsForCausalLM"], name
