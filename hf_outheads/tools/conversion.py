"""Turn a pretrained transformers LM into an `OutHeadsFor*` model without losing what it knows."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedModel
from transformers.models.auto.modeling_auto import MODEL_MAPPING

from ..backbones import OUTPUT_BIAS_BUFFERS, logit_transform, unrepresentable
from ..configuration_outheads import OutHeadsConfig
from ..head_catalog import get_head_class
from ..head_options import HeadOptions

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


def auto_body_class(config) -> type | None:
    """The class `AutoModel.from_config(config)` builds (an hf_outheads model's backbone), or None."""
    return MODEL_MAPPING[type(config)] if type(config) in MODEL_MAPPING else None


def backbone_module(model: PreTrainedModel) -> torch.nn.Module:
    """The body of a plain LM: its `base_model`, or where that is the model itself (its prefix names
    no attribute, e.g. Llama 4's text model), the child of the class `AutoModel` builds for its
    config, else the model (T5, whose body is the model less its head)."""
    if model.base_model is not model:
        return model.base_model
    body = auto_body_class(model.config)
    return next((child for child in model.children() if body is not None and isinstance(child, body)), model)


def backbone_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The original's weights under the names of `AutoModel.from_config(model.config)`."""
    if is_outheads(model):
        return model.backbone.state_dict()
    if backbone_module(model) is not model:
        return backbone_module(model).state_dict()
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


def check_representable(model: PreTrainedModel) -> None:
    """A ValueError naming the family and what it does when no head of this package computes a plain
    LM's logits: a family setting a field of `backbones.UNREPRESENTABLE`, or an LM head with
    parameters besides its output matrix and bias (BERT's dense layer and norm before it, ...), or
    a body that is not the one `AutoModel` builds for the config (BART's decoder alone)."""
    family = model.config.model_type
    why = unrepresentable(model.config)
    if why:
        raise ValueError(f"{type(model).__name__} cannot be converted: {why}, which no hf_outheads head computes.")
    nested = sorted({"encoder", "decoder"} & set(getattr(model.config, "sub_configs", {}) or {}))
    if nested:
        raise ValueError(f"{type(model).__name__} ('{family}') cannot be converted: its config nests sub-configs "
                         f"{nested}, which transformers' get_text_config cannot tell from the text_config an "
                         "hf_outheads config nests the backbone's under.")
    expected = auto_body_class(model.config)
    if expected is None:
        raise ValueError(f"{type(model).__name__} ('{family}') cannot be converted: AutoModel has no class for its "
                         "config, and hf_outheads builds its backbone with AutoModel.from_config.")
    body, head = backbone_module(model), model.get_output_embeddings()
    if body is model:  # (T5: the body is the model less its head)
        return
    known = {id(p) for module in (body, head) if module is not None for p in module.parameters()}
    extra = [name for name, p in model.named_parameters() if id(p) not in known]
    if extra:
        raise ValueError(f"{type(model).__name__} ('{family}') cannot be converted: its LM head computes more than "
                         f"`W h + b`: it has {len(extra)} parameters besides its output matrix and bias ({extra[0]}, ...), "
                         "which no hf_outheads head holds.")
    if not isinstance(body, expected):
        raise ValueError(f"{type(model).__name__} ('{family}') cannot be converted: its body is a {type(body).__name__}, "
                         f"not the {expected.__name__} that AutoModel builds for its config (an hf_outheads model's "
                         "backbone). Convert the family's full model (its *ForConditionalGeneration).")


def head_transform_defaults(options_class, transform: tuple[float, float]) -> dict:
    """The original's logit transform as defaults of a head whose options take it (`logit_transforms`)."""
    names = {f.name for f in dataclasses.fields(options_class)}
    values = {"logit_scale": transform[0], "logit_softcap": transform[1]}
    return {name: value for name, value in values.items() if name in names}


def origin(pretrained, original: PreTrainedModel) -> str | None:
    """What the converted model comes from: the Hub id or path it was given, else the loaded
    model's own (`name_or_path`, or the origin an hf_outheads model records)."""
    if isinstance(pretrained, (str, os.PathLike)):
        source = os.fspath(pretrained)
    else:
        recorded = original.config.base_model if is_outheads(original) else None
        source = getattr(original, "name_or_path", None) or recorded or None
    return os.path.abspath(source) if source and os.path.isdir(source) else source  # a folder: its absolute path


def asks_nothing(head_options) -> bool:
    """`head_options` ask nothing of the head: None, `{}`, or an options object at its head's defaults."""
    return not head_options or (isinstance(head_options, HeadOptions) and head_options == type(head_options)())


def convert_pretrained(cls, pretrained, head_type=None, head_options=None, **kwargs):
    if isinstance(head_options, HeadOptions) and head_type is None:  # an options object names its head
        head_type = head_options.head_type
    original = load_original(pretrained, **kwargs)
    if is_outheads(original) and head_type in (None, original.config.head_type) and asks_nothing(head_options):
        if not isinstance(original, cls):
            raise ValueError(f"{pretrained!r} is an {type(original).__name__}, not an {cls.__name__}: load it with "
                             f"{type(original).__name__} (its task) instead.")
        return original  # already this head (e.g. a trained `joint` model to fine-tune further): nothing to convert
    if not is_outheads(original):
        check_representable(original)
    weight, bias = original_lm_head(original)
    source = original.backbone if is_outheads(original) else original
    embeddings = source.get_decoder().get_input_embeddings().weight
    if head_type is None:
        head_type = "tied" if weight.shape == embeddings.shape and torch.equal(weight, embeddings) else "linear"
    given = head_options if isinstance(head_options, HeadOptions) else \
        get_head_class(head_type).Options.from_dict(head_options)
    transform = original.head.logit_transform() if is_outheads(original) else logit_transform(original.config)
    # scale and cap unset: the original's
    head_options = given.for_conversion().with_defaults(head_transform_defaults(type(given), transform))
    text_config = copy.deepcopy(original.config.text_config if is_outheads(original) else original.config)
    scale = {"hidden_scale": original.config.hidden_scale} if is_outheads(original) else {}
    config = OutHeadsConfig(text_config=text_config, head_type=head_type, head_options=head_options,
                            base_model=origin(pretrained, original), **scale)  # refuses another head's options object
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
    if model.head.logit_transform() != transform:
        logger.warning("Head '%s' transforms its scores with (scale, softcap) %s and the original LM head of %s with %s "
                       "(options logit_scale, logit_softcap): its logits differ from the original's.",
                       head_type, model.head.logit_transform(), type(original).__name__, transform)
    elif not exact:
        logger.warning(
            "Head '%s' cannot reproduce the original LM head of %s exactly; it starts from the closest "
            "initialisation its form allows (see the head's init_from_lm_head).",
            head_type,
            type(original).__name__,
        )
    model.generation_config = copy.deepcopy(original.generation_config)
    return model.train(original.training)  # as the original (from_pretrained gives eval mode)
