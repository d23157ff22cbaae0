"""What the sharded-training workers (tests/fsdp_worker.py, tests/deepspeed_worker.py) share: the
heads they train (every registered head, derived from the catalog; tiny Llama, dropout off: the
sharded and unsharded runs see the same function), the batches, and the unsharded reference run
they are compared with."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

from hf_outheads import HEAD_CLASSES
from tiny import VOCAB, tiny_model
from hf_outheads.training.options import head_spec


def variants() -> dict[str, dict]:
    """Every registered head with its contract options (`contract_options`), its further forms
    (`contract_variants`: `<head>-<suffix>`), and the form that reads `E` of each head whose option
    `tied` makes it do so (`<head>-tied`), as a config's
    `head_options_by_head` writes them: the workers name a case's head by `hf_outheads.training.options.head_spec`,
    the one rule from a run name to its head."""
    cases = {}
    for head_type, cls in HEAD_CLASSES.items():
        cases[head_type] = dict(cls.contract_options)
        for suffix, options in cls.contract_variants.items():
            cases[f"{head_type}-{suffix}"] = {"head_type": head_type, **cls.contract_options, **options}
        if "tied" in {f.name for f in dataclasses.fields(cls.Options)}:
            cases[f"{head_type}-tied"] = {"head_type": head_type, **cls.contract_options, "tied": True}
    return cases


VARIANTS = variants()
CASES = {name: head_spec(name, VARIANTS) for name in VARIANTS}  # name -> HeadSpec
STEPS, LR, ROWS, LENGTH = 3, 0.5, 2, 9  # ROWS per process


def case_model(name: str):
    """The tiny Llama model of case `name`, every dropout off (`dropout_off`)."""
    spec = CASES[name]
    return dropout_off(tiny_model("llama", spec.head_type, spec.options))


def dropout_off(model):
    """Every `nn.Dropout`'s rate to 0, as TRL's `disable_dropout_in_model` does (a head's dropout is
    one: `head_interface.OutputHead`), so that each process's half of a batch sees the reference's function."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(3, VOCAB, (2 * ROWS, LENGTH), generator=g) for _ in range(STEPS)]


def reference_run(model) -> dict:
    """SGD steps on the whole batches, unsharded, one process: each step's loss is the mean of
    both halves' losses (what the processes' averaged gradients give). Returns the losses and
    the final state dict."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for ids in batches():
        halves = ids.split(ROWS)
        loss = sum(model(input_ids=h, labels=h).loss for h in halves) / len(halves)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def mean_over_processes(value: torch.Tensor) -> float:
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.AVG)
    return value.item()


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)
