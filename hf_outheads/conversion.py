"""Turn a pretrained transformers LM into an `OutHeadsFor*` model without losing what it knows."""

from __future__ import annotations

import copy
import logging
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedModel

from .backbones import OUTPUT_BIAS_BUFFERS
from .configuration_outheads import OutHeadsConfig
from .head_catalog import get_head_class
from .head_options import HeadOptions

logger = logging.getLogger(__name__)


def load_original(pretrained, **kwargs) -> PreTrainedModel:
    """A loaded LM as is; a Hub id or local path through the matching Auto class."""
    if isinstance(pretrained, PreTrainedModel):
        return pretrained
    config = AutoConfig.from_pretrained(pretrained, **{k: v for k, v in kwargs.items() if k in ("revision", "token")})
    auto = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
    return auto.from_pretrained(pretrained, **kwargs)


def is_outheads(model: PreTrainedModel) -> bool:
    return isinstance(model.config, OutHeadsConfig)


def original_lm_head(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of the original head: `lm_head.bias` plus BART-style bias buffers; for an
    `hf_outheads` model, its head's plain form (`tied` / `linear` heads only)."""
    if is_outheads(model):
        plain = model.head.plain_lm_head(model.output_embedding_matrix())
        if plain is None:
            raise ValueError(f"This model's '{model.config.head_type}' head is not a plain softmax: only models with "
                             "a 'tied' or 'linear' head can be converted to another head.")
        return plain
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings: pass a *ForCausalLM / *ForConditionalGeneration model.")
    weight = head.weight.detach()
    bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
    for slot in output_bias_slots(model):
        bias = bias + slot.detach().reshape(-1)
    return weight, bias


def backbone_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The original's weights under the names of `AutoModel.from_config(model.config)`."""
    if is_outheads(model):
        return model.backbone.state_dict()
    if model.base_model is not model:
        return model.base_model.state_dict()
    head_names = {name for name, module in model.named_modules() if module is model.get_output_embeddings()}
    return {
        key: value
        for key, value in model.state_dict().items()
        if key.split(".")[0] not in head_names | set(OUTPUT_BIAS_BUFFERS)
    }


def load_backbone_state_dict(model: PreTrainedModel, state: dict[str, torch.Tensor]) -> None:
    """The inverse of `backbone_state_dict` for a plain LM: load `state` (names of
    `AutoModel.from_config(model.config)`) into `model`'s backbone, or a ValueError naming the
    keys that do not fit (only the LM head and its bias buffers may stay unloaded)."""
    target = model.base_model if model.base_model is not model else model
    own_head = set(target.state_dict()) - set(backbone_state_dict(model))  # lm_head / bias buffers (T5: on the model)
    missing, unexpected = target.load_state_dict(state, strict=False)
    missing = [key for key in missing if key not in own_head]
    if missing or unexpected:
        raise ValueError(f"Could not map the backbone's weights onto {type(model).__name__}: missing {missing}, "
                         f"unexpected {unexpected}. (Adapters: merge them first, e.g. PEFT's merge_and_unload().)")


def output_bias_slots(model: PreTrainedModel) -> list[torch.Tensor]:
    """Where a plain LM adds a per-word bias to its logits (what `original_lm_head` sums):
    `lm_head.bias` and the family's bias buffers (`OUTPUT_BIAS_BUFFERS`); empty for most."""
    head = model.get_output_embeddings()
    slots = [head.bias] if getattr(head, "bias", None) is not None else []
    return slots + [getattr(model, name) for name in OUTPUT_BIAS_BUFFERS if hasattr(model, name)]


@torch.no_grad()
def write_lm_head(model: PreTrainedModel, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """The inverse of `original_lm_head` for a plain LM: its output matrix becomes `weight`
    (with tied embeddings that is E itself) and its bias `bias` (None: zero), in the first of
    `output_bias_slots`; a ValueError for a non-zero bias where the family has no slot."""
    slots = output_bias_slots(model)
    if not slots and bias is not None and torch.count_nonzero(bias):
        raise ValueError(f"{type(model).__name__} adds no bias to its logits: it cannot hold a non-zero output bias.")
    model.get_output_embeddings().weight.copy_(weight)
    for slot in slots:
        slot.zero_()
    if slots and bias is not None:
        slots[0].copy_(bias.reshape(slots[0].shape))


def origin(pretrained, original: PreTrainedModel) -> str | None:
    """What the converted model comes from: the Hub id or path it was given, else the loaded
    model's own (`name_or_path`, or the origin an hf_outheads model records)."""
    if isinstance(pretrained, (str, os.PathLike)):
        source = os.fspath(pretrained)
    else:
        recorded = original.config.base_model if is_outheads(original) else None
        source = getattr(original, "name_or_path", None) or recorded or None
    return os.path.abspath(source) if source and os.path.isdir(source) else source  # a folder: its absolute path


def convert_pretrained(cls, pretrained, head_type=None, head_options=None, **kwargs):
    original = load_original(pretrained, **kwargs)
    if is_outheads(original) and head_type in (None, original.config.head_type) and not head_options:
        if not isinstance(original, cls):
            raise ValueError(f"{pretrained!r} is an {type(original).__name__}, not an {cls.__name__}: load it with "
                             f"{type(original).__name__} (its task) instead.")
        return original  # already this head (e.g. a trained `joint` model to fine-tune further): nothing to convert
    weight, bias = original_lm_head(original)
    source = original.backbone if is_outheads(original) else original
    embeddings = source.get_decoder().get_input_embeddings().weight
    if head_type is None:
        head_type = "tied" if weight.shape == embeddings.shape and torch.equal(weight, embeddings) else "linear"
    options_class = get_head_class(head_type).Options
    given = head_options if isinstance(head_options, HeadOptions) else options_class.from_dict(head_options)
    head_options = given.for_conversion()  # checked against head_type by the config
    text_config = copy.deepcopy(original.config.text_config if is_outheads(original) else original.config)
    scale = {"hidden_scale": original.config.hidden_scale} if is_outheads(original) else {}
    config = OutHeadsConfig(text_config=text_config, head_type=head_type, head_options=head_options,
                            base_model=origin(pretrained, original), **scale)
    model = cls(config).to(dtype=weight.dtype, device=weight.device)
    if original.config._attn_implementation:  # keep the original's attention (e.g. attn_implementation="eager")
        model.set_attn_implementation(original.config._attn_implementation)

    missing, unexpected = model.backbone.load_state_dict(backbone_state_dict(original), strict=False)
    tied = set(model.backbone.all_tied_weights_keys)  # duplicates the backbone re-ties itself
    missing = [key for key in missing if key not in tied]
    if missing or unexpected:
        raise ValueError(
            f"Could not map {type(original).__name__}'s weights onto {type(model.backbone).__name__}: "
            f"missing {missing}, unexpected {unexpected}."
        )
    model.backbone.tie_weights()
    exact = model.head.init_from_lm_head(weight, bias, model.head.conversion_labels(weight, model.output_embedding_matrix()))
    if not exact:
        logger.warning(
            "Head '%s' cannot reproduce the original LM head of %s exactly; it starts from the closest "
            "initialisation its form allows (see the head's init_from_lm_head).",
            head_type,
            type(original).__name__,
        )
    model.generation_config = copy.deepcopy(original.generation_config)
    return model.train(original.training)  # as the original (from_pretrained gives eval mode)
