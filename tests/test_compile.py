"""Every head under `torch.compile` (inductor, which runs on a CPU): one training forward and
backward of the compiled model gives the eager model's loss and gradients, and no graph breaks
where the step would read a value back from the device. The fused losses run eagerly inside the
compiled model (a graph break: `losses`' module docstring), so a mixture's row-chunk loop is never
unrolled into the graph; the rest of the model (backbone, the head's latents, priors and label
encoders) is compiled."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from accelerate.state import AcceleratorState, GradientState
from torch._dynamo.utils import counters

from hf_outheads import get_head_class, losses
from head_cases import HEAD_CASES
from tiny import batch, tiny_model
from hf_outheads.training.options import RunOptions
from hf_outheads.training.run import training_function


def options(head: str) -> dict:
    """The contract options, with the fused training loss where the head offers a choice (what
    `training_loss: auto` trains with on a GPU)."""
    names = {field.name for field in dataclasses.fields(get_head_class(head).Options)}
    return {**HEAD_CASES[head], **({"training_loss": "chunked"} if "training_loss" in names else {})}


# dynamo's reasons for a graph break at a read of a tensor's values on the host (`.item()`, `.tolist()`, `if tensor`,
# an operation whose output size depends on the values)
HOST_READS = ("Tensor.item()", "Tensor.tolist()", "Data-dependent", "Dynamic shape operator")


def without_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.train()


@pytest.mark.parametrize("head", sorted(HEAD_CASES))
def test_compiled_training_step_equals_eager(head, monkeypatch):
    calls = []
    fused = losses.fused_mixture_nll
    monkeypatch.setattr(losses, "fused_mixture_nll", lambda *a, **k: calls.append(torch.compiler.is_compiling())
                        or fused(*a, **k))
    eager = without_dropout(tiny_model("gpt2", head, options(head)))
    compiled = without_dropout(tiny_model("gpt2", head, options(head)))
    compiled.load_state_dict(eager.state_dict())
    compiled.compile()
    counters.clear()
    inputs = batch("gpt2")
    want = eager(**inputs).loss
    want.backward()
    got = compiled(**inputs).loss
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        if p_eager.grad is None:
            assert p_compiled.grad is None, name
        else:
            torch.testing.assert_close(p_compiled.grad, p_eager.grad, rtol=1e-4, atol=1e-5, msg=name)
    if calls:  # the fused loss (mixtures, lightrnn, chunked single softmaxes) ran eagerly, not traced
        assert not any(calls) and len(calls) == 2
    breaks = [reason.split("\n")[0] for kind in ("graph_break", "unimplemented") for reason in counters[kind]]
    assert not [reason for reason in breaks if any(read in reason for read in HOST_READS)], breaks


def test_a_compiled_training_run_compiles_its_step_once(tmp_path):
    """`hf_outheads.training.train --torch_compile`: one graph for the whole run, compiled at the first step, with
    no graph break (no host sync inside the step) and no recompilation: not after a logging step, an
    evaluation or a checkpoint (evaluation and generation run eagerly), nor at an epoch's end, whose
    last, shorter batch a compiled run drops (here 33 blocks of 32 tokens in batches of 5: 6 steps an epoch,
    collated by a worker process that the second epoch keeps)."""
    options = RunOptions.from_flat(dict(
        task="causal_lm", model_preset="gpt2-tiny", model_overrides={"n_embd": 32, "n_layer": 1, "n_head": 2},
        dataset_name="stdlib_docstrings", dataset_config="text", max_train_samples=6, max_eval_samples=4,
        tokenizer="bpe", tokenizer_vocab_size=300, block_size=32, per_device_train_batch_size=5,
        per_device_eval_batch_size=8, dropout=0.0, max_steps=8, logging_steps=2, eval_steps=3, save_steps=5,
        sample_max_new_tokens=2, dataloader_num_workers=1, torch_compile=True, output_dir=str(tmp_path / "out")))
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    torch._dynamo.reset()
    counters.clear()
    # torch's own patch, not monkeypatch: pytest >= 9.2 undoes a module attribute it does not find in the
    # module's __dict__ by deleting it, which hides this config for the rest of the session
    with torch._dynamo.config.patch(error_on_recompile=True):
        results = training_function(options)
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
    assert math.isfinite(results["eval_perplexity"]) and (tmp_path / "out" / "model.safetensors").is_file()
