"""Every head under `torch.compile` (inductor, which runs on a CPU): one training forward and
backward of the compiled model gives the eager model's loss and gradients. The fused losses run
eagerly inside the compiled model (a graph break: `losses`' module docstring), so a mixture's
row-chunk loop is never unrolled into the graph; the rest of the model (backbone, the head's
latents, priors and label encoders) is compiled."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hf_outheads import get_head_class, losses
from head_cases import HEAD_CASES
from tiny import batch, tiny_model


def options(head: str) -> dict:
    """The contract options, with the fused training loss where the head offers a choice (what
    `training_loss: auto` trains with on a GPU)."""
    names = {field.name for field in dataclasses.fields(get_head_class(head).Options)}
    return {**HEAD_CASES[head], **({"training_loss": "chunked"} if "training_loss" in names else {})}


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

