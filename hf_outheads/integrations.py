"""What the model classes need to work with the libraries users train with (TRL, PEFT),
whatever the head. No import of those libraries: only the conventions they follow.

1. TRL's fused LM head. TRL's trainers (SFT, DPO, GRPO, KTO, RLOO) call
   `trl.trainer.utils.add_fused_lm_head(model, temperature=..., outputs=...)`, which replaces
   `model.forward` by a function that, called with `fused_lm_head=True`, runs `model.base_model`
   and multiplies its last hidden state by `model.get_output_embeddings().weight`: the LM head of
   a plain transformers model. An output head is not `W h + b` (a mixture, a label encoder, a
   hidden-state scale), so that function would bypass the head. The `OutHeadsFor*` classes answer
   the same call themselves, through the head (`fused_outputs` below), and keep their own
   `forward` when a replacement that takes `fused_lm_head` is assigned (`is_fused_lm_head_patch`);
   the patch's `temperature` is kept (`fused_lm_head_settings`).

2. Adapters on the input embeddings (PEFT LoRA on `wte` / `embed_tokens`, ...). Heads read the
   embedding matrix `E` directly, not through the embedding module's forward. A wrapped module
   (PEFT's convention: `get_base_layer()`) adds its adapters' contribution in its forward only,
   so `effective_embedding_weight` reads `E` as the backbone sees it: the base weight plus what
   the wrapper adds to each row, i.e. what `merge_and_unload()` would write into the weight.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from .head_interface import IGNORE_INDEX


@dataclass
class FusedLMHeadOutput(ModelOutput):
    """The fields of TRL's `FusedCausalLMOutput`, computed through the head. Per-token fields
    have the labels' shape (`(batch, seq_len - 1)`, or `(batch, seq_len)` with `shift_labels`)
    and are zero where the label is -100; `loss` is the mean negative log-likelihood under
    the temperature-scaled distribution plus the head's `aux_loss` (DOC's regulariser)."""

    loss: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None
    label_mask: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def fused_outputs(logits, labels, temperature=1.0, num_items_in_batch=None, aux_loss=None) -> FusedLMHeadOutput:
    """Per-token statistics of the next-token distributions `softmax(logits / temperature)`
    (`logits`: scores, or log-probabilities for heads that return them; both give the same
    distribution) at the positions of `labels` (same leading shape)."""
    mask = labels != IGNORE_INDEX
    scores = logits.float() / temperature
    log_p = scores.log_softmax(-1)
    gold = labels.clamp(min=0).unsqueeze(-1)
    log_probs = log_p.gather(-1, gold).squeeze(-1).masked_fill(~mask, 0.0)
    entropy = -(log_p.exp() * log_p).sum(-1).masked_fill(~mask, 0.0)
    with torch.no_grad():
        log_sum_sq = torch.logsumexp(2 * log_p, dim=-1).masked_fill(~mask, 0.0)
        finite = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))  # masked codes: -inf scores
        mean_logits = finite.mean(-1).masked_fill(~mask, 0.0)
        is_top1 = (log_p.argmax(-1) == labels) & mask
    count = mask.sum() if num_items_in_batch is None else num_items_in_batch
    loss = -log_probs.sum() / torch.as_tensor(count, device=log_probs.device).clamp(min=1)
    if aux_loss is not None:
        loss = loss + aux_loss
    return FusedLMHeadOutput(loss=loss, log_probs=log_probs, entropy=entropy, log_sum_sq_probs=log_sum_sq,
                             mean_logits=mean_logits, is_top1=is_top1, label_mask=mask, aux_loss=aux_loss)


def is_fused_lm_head_patch(model, value) -> bool:
    """`value`, being assigned to `model.forward`, is a fused-LM-head forward bound to `model`
    (it takes a `fused_lm_head` keyword) other than the class's own."""
    func = getattr(value, "__func__", None)
    if func is None or getattr(value, "__self__", None) is not model or func is type(model).forward:
        return False
    try:
        parameters = inspect.signature(func, follow_wrapped=False).parameters
    except (TypeError, ValueError):
        return False
    return "fused_lm_head" in parameters


def fused_lm_head_settings(value) -> dict:
    """The `temperature` the patch was made with (`add_fused_lm_head(model, temperature=...)`)."""
    try:
        captured = inspect.getclosurevars(value.__func__).nonlocals
    except (TypeError, ValueError):
        captured = {}
    temperature = captured.get("temperature", 1.0)
    return {"temperature": float(temperature) if isinstance(temperature, (int, float)) else 1.0}


def effective_embedding_weight(module: torch.nn.Module) -> torch.Tensor:
    """The `|V| x d` table `module` embeds with: `module.weight`, or for a module wrapped by
    adapters (it has `get_base_layer()`), the base weight plus the rows the wrapper adds in its
    forward (`module(ids) - base(ids)`: exact for any adapter, and zero when the adapters are
    disabled or merged). Gradients reach the adapters' parameters."""
    get_base = getattr(module, "get_base_layer", None)
    base = get_base() if callable(get_base) else module
    if base is module:
        return module.weight
    ids = torch.arange(base.weight.shape[0], device=base.weight.device)
    return base.weight + (module(ids) - base(ids)).to(base.weight.dtype)
