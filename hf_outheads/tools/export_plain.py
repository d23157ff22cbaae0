"""Write a model trained with a single-softmax head as the backbone's own transformers class
(`GPT2LMHeadModel`, `LlamaForCausalLM`, `T5ForConditionalGeneration`, `BartForConditionalGeneration`,
...), which any serving stack, converter or quantizer that knows the stock architectures runs.

At inference the label matrix `L = label_matrix(E)` of `tied`, `linear`, `bilinear`, `drill` and
`joint` does not depend on the context, and where the context is an affine map `A h + c` (the
identity; bilinear's `W_l h`; joint's `V h + b_v` with identity activation) the scores are one
affine map of the hidden state: `L (A h + c) + b = (L A) h + (L c + b)` (the head's
`equivalent_lm_head`). The export writes `L A`, times the model's `hidden_scale` over the
family's own output scale (T5), as the output matrix: tied to the input embeddings when it
equals them, else untied (`tie_word_embeddings=False`). The bias `L c + b` goes where the
family adds one (BART/Marian `final_logits_bias`, read and written by `conversion.py`); GPT-2,
Llama, Qwen2, Mistral and T5 have none, so a head with a non-zero bias is refused there unless
`approximate=True`, which drops the bias and measures the mean KL divergence from the
original's next-token distributions on given text. Heads without an affine form (mixtures;
joint with a tanh/sigmoid/relu context) are refused with the reason.

The head's logit transform (`logit_transforms`): its scale over the family's own (Cohere's
`logit_scale`, Granite's `logits_scaling`; 1 elsewhere) is folded into the output matrix and
bias; its soft cap goes into the family's field for one (Gemma 2/3's `final_logit_softcapping`,
`backbones.LOGIT_TRANSFORMS`); a family without such a field is refused, with the reason, unless
`approximate=True`, which drops the cap (a cap keeps the scores' order) and measures the KL
divergence as for a bias. Each refusal that `approximate=True` lifts is a `NotExact`.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedModel

from ..backbones import EXPORT_ALIASES, hidden_scale, logit_transform, with_logit_softcap
from .conversion import backbone_state_dict, load_backbone_state_dict, output_bias_slots, write_lm_head
from .folders import staged_folder
from ..head_catalog import HEAD_CLASSES
from .model_card import build_plain_model_card

# generation options that this package's models answer themselves (`use_mtp`: drafts from the `mtp` head's
# predictors, `OutHeadsPreTrainedModel._get_candidate_generator`); the export has no predictors, and a stock
# class given `use_mtp=True` looks for its own MTP layers and fails: the export's generation config drops them
OWN_GENERATION_KEYS = ("use_mtp",)


class NotExact(ValueError):
    """A refusal that `approximate=True` lifts: the model's scores need what the family's class
    cannot hold (an output bias, a soft cap), which the approximate export drops."""


@dataclass
class PlainExport:
    """What `export_plain` wrote: the folder, the transformers class, whether its logits are
    the model's (`exact`), the mean KL divergence (nats per position) from the model's
    next-token distributions to the plain model's on the given text (None when none was given),
    and what the approximate export dropped (`dropped`, in words; none when exact)."""

    path: str
    architecture: str
    exact: bool
    mean_kl: float | None = None
    dropped: list[str] = field(default_factory=list)


def plain_export_capabilities() -> dict[str, bool]:
    """The export's capability table: head type -> whether, with its default options, its model
    exports exactly (the head class's `exact_plain_export`), for every registered head."""
    return {head_type: cls.exact_plain_export for head_type, cls in HEAD_CLASSES.items()}


def _scaled(weight: torch.Tensor, factor: float) -> torch.Tensor:
    return weight if factor == 1.0 else (weight.double() * factor).to(weight.dtype)


def plain_config(model, weight: torch.Tensor, approximate: bool = False):
    """(config of the plain class, its output matrix, what it drops): the backbone config with the
    head's soft cap (`with_logit_softcap`, where it differs from the family's) and the family's
    `EXPORT_ALIASES`, tied when the output matrix (times `hidden_scale` and the head's logit scale, each
    over the family's own) is E, else untied. A cap the family has no field for is a `NotExact`, or,
    `approximate`, dropped."""
    embeddings = model.output_embedding_matrix().detach()
    scale, cap = model.head.logit_transform()
    capped, dropped = copy.deepcopy(model.config.text_config), []
    if cap != logit_transform(capped)[1]:
        try:
            with_logit_softcap(capped, cap)
        except ValueError as error:
            if not approximate:
                raise NotExact(
                    f"{error} Train without logit_softcap (or on a family that holds a cap: Gemma 2/3) to export "
                    "exactly, or pass approximate=True with texts or input_ids to drop the cap (it keeps the "
                    "scores' order) and measure the KL divergence it costs.") from None
            dropped.append(f"the head's soft cap of its scores at {cap:g}")
    for tie in (True, False):
        config = copy.deepcopy(capped)
        config.tie_word_embeddings = tie
        for alias, field in EXPORT_ALIASES.get(config.model_type, {}).items():
            setattr(config, alias, getattr(config, field))
        factor = model.config.hidden_scale / hidden_scale(config) * scale / logit_transform(config)[0]
        output = _scaled(weight, factor)
        if not tie or output.shape == embeddings.shape and torch.equal(output, embeddings):
            return config, output, dropped


def build_plain(model, approximate: bool = False) -> tuple[PreTrainedModel, list[str]]:
    """(the plain transformers model computing `model`'s logits, what it drops from them: nothing
    when exact); a ValueError when the head has no plain form, a `NotExact` when it has a soft cap
    (`plain_config`) or a non-zero bias the family cannot hold and `approximate` is False."""
    weight, bias = model.head.equivalent_lm_head(model.output_embedding_matrix())
    config, output, dropped = plain_config(model, weight, approximate)
    if bias is not None:  # the head's logit scale over the family's
        bias = _scaled(bias, model.head.logit_transform()[0] / logit_transform(config)[0])
    auto = AutoModelForSeq2SeqLM if model.config.is_encoder_decoder else AutoModelForCausalLM
    plain = auto.from_config(config, dtype=output.dtype).to(output.device)
    held = bool(output_bias_slots(plain)) or bias is None or not torch.count_nonzero(bias)
    if not held and not approximate:
        raise NotExact(
            f"Head '{model.config.head_type}' adds a per-word output bias (max |b| = {bias.abs().max().item():.3g}), "
            f"and {type(plain).__name__} adds none to its logits, so no such checkpoint computes this model's "
            "logits. Train with head_options={'output_bias': False} to export exactly, or pass approximate=True "
            "with texts or input_ids to drop the bias and measure the KL divergence it costs.")
    if not held:
        dropped.append("the head's per-word output bias")
    load_backbone_state_dict(plain, backbone_state_dict(model))
    write_lm_head(plain, output, bias if held else None)
    plain.generation_config = copy.deepcopy(model.generation_config)
    for key in OWN_GENERATION_KEYS:
        setattr(plain.generation_config, key, None)  # GenerationConfig's default: unset
    return plain.eval(), dropped


def _sequences(texts, input_ids, tokenizer) -> list[torch.Tensor]:
    if texts is not None:
        if tokenizer is None:
            raise ValueError("texts need the tokenizer: pass tokenizer=..., or token ids as input_ids.")
        return [torch.as_tensor(tokenizer(text)["input_ids"]) for text in texts]
    return [torch.as_tensor(row) for row in (input_ids if input_ids is not None else [])]


@torch.no_grad()
def mean_kl(model, plain, sequences: list[torch.Tensor]) -> float:
    """Mean over positions of KL(model || plain) of the next-token distributions, each
    sequence run alone (seq2seq: as the source and, shifted right, as the decoder input)."""
    total, count = 0.0, 0
    for ids in sequences:
        inputs = {"input_ids": ids.reshape(1, -1).to(plain.device)}
        if model.config.is_encoder_decoder:
            inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(inputs["input_ids"])
        log_p = model(**inputs).logits.float().log_softmax(-1)
        log_q = plain(**inputs).logits.float().log_softmax(-1)
        total += (log_p.exp() * (log_p - log_q)).sum().item()
        count += log_p.shape[:-1].numel()
    return total / max(count, 1)


def export_plain(model, path, tokenizer=None, *, approximate: bool = False, texts=None, input_ids=None,
                 overwrite: bool = False, repo_id: str | None = None, license: str | None = None,
                 **save_kwargs) -> PlainExport:
    """Write `model` (an `OutHeadsFor*` model) to `path` as its backbone's own transformers
    class: weights, config, generation config, `tokenizer` if given, and a model card naming
    the head it was trained with. Loads with `AutoModelForCausalLM` / `AutoModelForSeq2SeqLM`,
    no `hf_outheads`, no remote code. `approximate=True` allows dropping an output bias or a soft
    cap the family cannot hold (it needs `texts` with the tokenizer, or `input_ids`: a list of token
    id sequences, on which the cost is measured as the mean KL divergence). `save_kwargs` go to
    `save_pretrained` (e.g. `max_shard_size`). A non-empty `path` is refused unless `overwrite`, and
    so is a `path` that is, contains or lies inside the folder the model was loaded from; the export
    is written to a sibling folder and then swapped in whole (`folders.staged_folder`), so `path`
    never holds files of two models. `repo_id` (default: `path`, absolute) is what the card's usage code loads,
    `license` its license (e.g. the trained model's)."""
    sequences = _sequences(texts, input_ids, tokenizer)
    if approximate and not sequences:
        raise ValueError("approximate=True measures what the approximation costs: pass texts (with the tokenizer) "
                         "or input_ids, a few sequences of the kind the model will serve.")
    was_training = model.training
    model.eval()
    try:
        plain, dropped = build_plain(model, approximate)
        kl = mean_kl(model, plain, sequences) if sequences else None
    finally:
        model.train(was_training)
    path = os.path.normpath(os.fspath(path))
    # the folder the model was loaded from is read: never the target, nor inside it or around it
    with staged_folder(path, overwrite=overwrite, sources=[model.name_or_path],
                       overwrite_hint="pass overwrite=True (on the command line --overwrite)") as written:
        plain.save_pretrained(written, **save_kwargs)
        if tokenizer is not None:
            tokenizer.save_pretrained(written)
        result = PlainExport(path, type(plain).__name__, not dropped, kl, dropped)
        card = build_plain_model_card(model, result, repo_id or os.path.abspath(path), license=license, tokenizer=tokenizer is not None)
        card.save(os.path.join(written, "README.md"))
    return result
