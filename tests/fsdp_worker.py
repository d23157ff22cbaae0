"""Run by tests/test_fsdp.py under torchrun: 2 CPU processes (gloo). For each head
(tests/sharded_cases.py), a tiny Llama model is sharded with FSDP2 by accelerate's own preparation (`fsdp2_prepare_model`, which
applies `torch.distributed.fsdp.fully_shard` group by group, as `accelerate launch` with
training/accelerate_fsdp2.yaml does; accelerate's Accelerator refuses FSDP on a CPU, so the
function is called with the few attributes it reads), trained a few SGD steps, each process on
its half of every batch, and compared with the same model trained unsharded on both halves.
The full state dict is saved with `save_pretrained` and loaded back with `from_pretrained`.
Rank 0 writes what it measured as JSON to argv[1]; the test judges it. argv[2], when given, names the
cases to run (comma-separated; default: every case)."""

from __future__ import annotations

import json
import sys
import tempfile
import types
import warnings

import torch
import torch.distributed as dist
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hf_outheads import OutHeadsForCausalLM
from sharded_cases import CASES, LR, ROWS, batches, case_model, dropout_off, max_diff


def shard(model):
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap")
    accelerator = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                        mixed_precision="no", is_main_process=dist.get_rank() == 0,
                                        device=torch.device("cpu"))
    return fsdp2_prepare_model(accelerator, model)


def train(model, rank):
    """SGD steps; rank None: unsharded, the mean of both halves' losses (what FSDP's averaged
    gradients give). Returns the losses (the sharded ones averaged over the processes)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for ids in batches():
        halves = ids.split(ROWS)
        if rank is None:
            loss = sum(model(input_ids=h, labels=h).loss for h in halves) / len(halves)
        else:
            loss = model(input_ids=halves[rank], labels=halves[rank]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = loss.detach().clone()
        if rank is not None:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    return losses


def run_case(name: str, rank: int, folder: str) -> dict:
    reference = case_model(name).train()
    expected_losses = train(reference, None)
    model = case_model(name).train()
    reads_embeddings = model.head.reads_embeddings
    embedding = model.backbone.get_input_embeddings()
    model = shard(model)
    layers = model.backbone.layers
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = train(model, rank)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    result = {
        "losses": losses,
        "expected_losses": expected_losses,
        "view_warnings": sorted({str(w.message)[:120] for w in caught if "view tensor" in str(w.message)}),
        # the plan: E and the head in one group; each decoder layer (`_no_split_modules`) in its own
        "embedding_with_head": embedding._get_fsdp_state() is model.head._get_fsdp_state(),
        "reads_embeddings": reads_embeddings,
        "layers_apart": len({id(layer._get_fsdp_state()) for layer in layers}) == len(layers)
        and all(layer._get_fsdp_state() is not model._get_fsdp_state() for layer in layers),
        "no_split_modules": sorted(model._no_split_modules),
    }
    if rank == 0:
        result["weight_diff"] = max_diff(state, reference.state_dict())
        path = f"{folder}/{name}"
        model.save_pretrained(path, state_dict=state)
        loaded = dropout_off(OutHeadsForCausalLM.from_pretrained(path)).train()
        result["architectures"] = loaded.config.architectures
        result["loaded_diff"] = max_diff(loaded.state_dict(), reference.state_dict())
        ids = batches()[0]
        with torch.no_grad():
            result["loaded_loss_diff"] = abs(loaded(input_ids=ids, labels=ids).loss.item()
                                             - reference(input_ids=ids, labels=ids).loss.item())
    return result


def main(out_path: str, names: list[str]) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            results[name] = run_case(name, rank, folder)
            dist.barrier()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES))
