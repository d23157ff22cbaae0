"""FSDP2 (torch `fully_shard`, through accelerate's `fsdp2_prepare_model`) on 2 CPU processes:
every head trains to the unsharded run's losses and weights, the heads that read `E` share its
sharding group, and a full state dict saved with `save_pretrained` loads back with
`from_pretrained`. One torchrun launch (tests/fsdp_worker.py) measures every head."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from hf_outheads import HeadInputs
from sharded_cases import CASES
from subprocess_runs import run

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without torch.distributed")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "results.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])}  # this checkout
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(HERE / "fsdp_worker.py"), str(out)]
    done = run(command, env=env, cwd=HERE, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(out.read_text())


def test_fsdp2_trains_every_head_as_unsharded(results):
    assert set(results) == set(CASES)
    assert {result["reads_embeddings"] for result in results.values()} == {True, False}  # both kinds of head ran
    for name, result in results.items():
        assert result["losses"] == pytest.approx(result["expected_losses"], abs=1e-5), name
        assert len(set(result["losses"])) == len(result["losses"]), f"{name}: the steps changed nothing"
        assert result["weight_diff"] < 1e-5, (name, result["weight_diff"])
        # the wrap plan: E's group holds the head exactly when the head reads E; decoder layers apart
        assert result["embedding_with_head"] == result["reads_embeddings"], name
        assert result["layers_apart"] and result["no_split_modules"] == ["LlamaDecoderLayer"], name
        # no output of a sharded module is a view (FSDP2 would drop the pre-backward hook of an in-place op on it)
        assert result["view_warnings"] == [], (name, result["view_warnings"])


def test_fsdp2_full_state_dict_loads_with_from_pretrained(results):
    for name, result in results.items():
        assert result["architectures"] == ["OutHeadsForCausalLM"], name
        assert result["loaded_diff"] < 1e-5 and result["loaded_loss_diff"] < 1e-5, (name, result)


def scores_read_e(head, embeddings: torch.Tensor) -> bool:
    """Whether the head's eval-mode scores move when `E` does, its other inputs held fixed."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, 3, head.dims.hidden_dim, generator=g)
    layers = {i: torch.randn(1, 3, head.dims.hidden_dim, generator=g) for i in head.layer_indices}
    with torch.no_grad():
        scores = [head.eval()(HeadInputs(hidden=hidden, embeddings=e, layers=layers)).logits
                  for e in (embeddings, embeddings + torch.randn(embeddings.shape, generator=g))]
    return not torch.equal(*scores)


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5", "bart"])
def test_heads_reading_e_say_so_and_show_it_as_their_weight(family):
    """What accelerate's FSDP2 wrap reads to keep E and the output layer in one group:
    `get_output_embeddings().weight is get_input_embeddings().weight`, for the heads that read E
    only (their scores move with E; `head.reads_embeddings` says so), after a resize, a new
    embedding module and in a deep copy."""
    import copy

    from tiny import tiny_model

    kinds = set()
    for name, spec in CASES.items():
        model = tiny_model(family, spec.head_type, spec.options)
        reads_e = scores_read_e(model.head, model.output_embedding_matrix().detach())
        assert model.head.reads_embeddings == reads_e, (family, name)
        kinds.add(reads_e)
        for probe in (model, copy.deepcopy(model)):
            weight = getattr(probe.get_output_embeddings(), "weight", None)
            assert (weight is probe.get_input_embeddings().weight) == reads_e, (family, name)
        model.resize_token_embeddings(model.config.vocab_size + 3)
        model.set_input_embeddings(torch.nn.Embedding(*model.get_input_embeddings().weight.shape))  # a new module
        weight = getattr(model.get_output_embeddings(), "weight", None)
        assert (weight is model.get_input_embeddings().weight) == reads_e, (family, name, "replaced")
        embedding = model.get_input_embeddings().weight  # the head holds no parameter of the backbone's
        assert not [key for key, p in model.named_parameters(remove_duplicate=False) if key.startswith("head.")
                    and p is embedding], (family, name)
    assert kinds == {True, False}
