"""What the sharded-training workers (tests/fsdp_worker.py, tests/deepspeed_worker.py) share: the
heads they train (tiny Llama, dropout off: the sharded and unsharded runs see the same function),
the batches, and the unsharded reference run they are compared with."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tiny import VOCAB

_LIGHTRNN = {"num_components": 2, "num_exclusive": 8, "num_rows": 8, "num_columns": 16, "latent_dropout": 0.0}
_DOC = {"components": [[-1, 2], [1, 1], [0, 1]], "latent_dropout": 0.0}
CASES = {  # name: head options; the head type is the name up to "-"
    "tied": {},
    "linear": {},
    "drill": {"depth": 2, "dropout": 0.0},
    "joint": {"joint_dim": 16},
    "mos": {"num_components": 3, "latent_dropout": 0.0},
    "mos-tied": {"num_components": 3, "latent_dropout": 0.0, "tied": True},
    "doc": _DOC,
    "doc-tied": {**_DOC, "tied": True},
    "lightrnn": _LIGHTRNN,
    "lightrnn-tied": {**_LIGHTRNN, "tied": True},
    "sigsoftmax": {},
    "mtp": {"num_future": 2, "num_attention_heads": 2},  # shared head `tied`: scores with E
    "mtp-independent": {"num_future": 2, "num_attention_heads": 2, "form": "independent", "head": "linear"},
}
READS_E = {"tied", "drill", "joint", "lightrnn-tied", "mos-tied", "doc-tied", "mtp"}  # heads scoring with E
STEPS, LR, ROWS, LENGTH = 3, 0.5, 2, 9  # ROWS per process


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
