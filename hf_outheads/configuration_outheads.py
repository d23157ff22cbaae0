"""`OutHeadsConfig`: any backbone config (nested as `text_config`) plus an output-head spec."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from transformers import AutoConfig, GenerationConfig, PretrainedConfig

from .backbones import head_dims, hidden_scale
from .compat import SubConfigSpec
from .head_catalog import get_head_class
from .head_options import HeadOptions
from .model_io import PACKAGE

FROM_BACKBONE = ("Build the model with OutHeadsForCausalLM.from_backbone(...) / OutHeadsForSeq2SeqLM.from_backbone(...) "
                 "(a plain transformers model or its folder), or OutHeadsConfig(text_config=..., head_type=...).")
_GENERATION_KEYS: set[str] = set()
_RESOLVED = "_resolved_head_options"  # where the config keeps `resolved_head_options`


def not_from_backbone(name: str) -> bool:
    """Attributes the composite never reads from `text_config`: private ones and generation
    parameters (those belong in `generation_config`; transformers rejects them on a config)."""
    if not _GENERATION_KEYS:
        _GENERATION_KEYS.update(GenerationConfig._get_default_generation_params())
    return name.startswith("_") or name in _GENERATION_KEYS


def import_model_classes() -> None:
    """Import the installed package's model classes (`modeling_outheads`, which registers them with
    the Auto model classes when imported) when a config is first built: every
    `Auto*.from_pretrained` / `from_config` of this model type builds its config first, so
    importing this module (which registers only this config, importing no modelling code) is
    all those calls need."""
    if __package__ == PACKAGE:  # remote code's copy (another package) imports nothing: transformers loads it
        from . import modeling_outheads  # noqa: F401  (upward, at call time: `import hf_outheads` stays light)


class OutHeadsConfig(PretrainedConfig):
    """Configuration of an `OutHeadsFor*` model.

    Args:
        text_config: the backbone's config (object, or dict with `model_type`). Required with
            any other argument; `OutHeadsConfig()` alone (which transformers builds internally
            for its defaults) has none, and no model can be built from it.
        head_type: one of the registered heads (`linear`, `tied`, `bilinear`, ...); `tied` when
            omitted; required in a saved config.json.
        head_options: the head's hyper-parameters: a dict for `head_type` (checked here against the
            head's declarations), or the head's options object, checked when it was built (what a
            training run's `HeadSpec` carries), which names its head: `head_type` may then be
            omitted. Omitted options take the head's defaults. Resolved once
            (`resolved_head_options`) and stored fully expanded as a dict, so a saved config states
            every value used.
        hidden_scale: positive factor on the final hidden state before the head; derived from
            the backbone family when omitted (T5 with tied embeddings: `d_model ** -0.5`).
        vocab_size: optional check; must equal the backbone's vocabulary size.
        base_model: where the weights came from (the Hub id or local path `from_backbone` was
            given); the model card's `base_model` when it is a Hub id.

    Backbone attributes the composite does not define (`max_position_embeddings`, `d_model`,
    ...) are read from `text_config`, except generation parameters.
    Example: `OutHeadsConfig(text_config=GPT2Config(), head_type="tied")`.
    """

    model_type = "outheads"
    if SubConfigSpec is not None:  # transformers 5.24 and later (compat.py)
        sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="gpt2", optional=True)}
    else:
        sub_configs = {"text_config": AutoConfig}

    text_config: dict | PretrainedConfig | None = None
    head_type: str | None = None  # "tied" once a text_config is given; None only in the argument-less config
    head_options: dict | HeadOptions | None = None
    hidden_scale: float | None = None
    vocab_size: int | None = None
    base_model: str | None = None
    is_encoder_decoder: bool = False
    tie_word_embeddings: bool = False  # the `tied` head reads E at call time: no weight is duplicated
    def __post_init__(self, **kwargs):
        import_model_classes()
        if SubConfigSpec is None and isinstance(self.text_config, dict):  # what SubConfigSpec does from 5.24 on
            self.text_config = AutoConfig.for_model(**self.text_config)
        super().__post_init__(**kwargs)
        text = self.text_config
        if text is None:  # the argument-less config transformers builds (diffs, defaults): no model from it
            given = [key for key in ("head_type", "head_options") if getattr(self, key) is not None]
            if given:  # it would save, then fail to load (from_dict) or to build a model: refuse it now
                raise ValueError(f"OutHeadsConfig got {' and '.join(given)} but no text_config (backbone config). "
                                 f"{FROM_BACKBONE}")
            return
        if self.head_type is None:  # an options object names its head; nothing: `tied`
            self.head_type = self.head_options.head_type if isinstance(self.head_options, HeadOptions) else "tied"
        if self.vocab_size is not None and self.vocab_size != text.vocab_size:
            raise ValueError(
                f"vocab_size={self.vocab_size} does not match the backbone's vocab_size={text.vocab_size}. "
                "Resize the backbone (model.resize_token_embeddings) or drop vocab_size."
            )
        self.vocab_size = text.vocab_size
        self.is_encoder_decoder = bool(getattr(text, "is_encoder_decoder", False))
        if not self.architectures:  # the class that runs this backbone: AutoModel (registered with both) picks by it
            self.architectures = ["OutHeadsForSeq2SeqLM" if self.is_encoder_decoder else "OutHeadsForCausalLM"]
        if self.hidden_scale is None:
            self.hidden_scale = hidden_scale(text)
        value = self.hidden_scale
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"hidden_scale must be a positive finite number, got {value!r}; omit it to use the "
                             f"backbone family's default ({hidden_scale(text)}).")
        self.hidden_scale = float(value)
        self.head_options = dataclasses.asdict(self.resolved_head_options)

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs):
        """As `PretrainedConfig.from_dict` (config.json, `from_pretrained`), but a config without
        `text_config` or `head_type` (another model's, or hand-written) is an error. Saved
        `head_options` are built into the head's options object here (the head looked up once)."""
        missing = [key for key in ("text_config", "head_type") if config_dict.get(key) is None and kwargs.get(key) is None]
        if missing:
            kind = config_dict.get("model_type")
            raise ValueError(f"This {'`' + kind + '` ' if kind else ''}config has no {' and no '.join(missing)}, so it "
                             f"is not an hf_outheads config. {FROM_BACKBONE}")
        saved, head_type = config_dict.get("head_options"), kwargs.get("head_type") or config_dict["head_type"]
        if isinstance(saved, dict) or saved is None:  # options added since it was saved keep that version's behaviour
            options_class = get_head_class(head_type).Options
            config_dict = {**config_dict, "head_type": head_type,
                           "head_options": options_class.from_dict(options_class.for_saved(saved))}
        return super().from_dict(config_dict, **kwargs)

    def __getattr__(self, name: str):
        """Called only for attributes this config lacks: the backbone's (see the class docstring)."""
        text = self.__dict__.get("text_config")
        if text is None or not_from_backbone(name):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return getattr(text, name)

    @property
    def use_cache(self) -> bool | None:
        """The backbone's `use_cache` (`text_config.use_cache`), read and written here: the value the
        backbone's forward falls back to when called with `use_cache=None`, as the one config that
        transformers' own LMs share with their backbone. So `model.config.use_cache = False` (what
        Trainer sets from `TrainingArguments.use_cache`) builds no KV cache in training, and with
        no cache transformers keeps the packed-sequence mask of padding-free batches
        (`DataCollatorWithFlattening`). `generate` passes `generation_config.use_cache` itself."""
        text = self.__dict__.get("text_config")
        if text is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute 'use_cache' (no text_config)")
        return getattr(text, "use_cache", None)

    @use_cache.setter
    def use_cache(self, value: bool | None) -> None:
        if self.__dict__.get("text_config") is None:
            raise ValueError(f"OutHeadsConfig got use_cache but no text_config (backbone config). {FROM_BACKBONE}")
        self.text_config.use_cache = value

    @property
    def resolved_head_options(self) -> HeadOptions:
        """The one place a model's head options are resolved: `head_options` for `head_type`
        (an options object as it is, a dict checked against `head_type`'s declarations),
        completed against the backbone's sizes (`HeadOptions.resolve`), the object the model
        hands to its head, which reads it as it is. Resolved when the config is built and kept
        until `head_type`, `head_options` or the sizes change (an edit, a resize); never
        serialised (`to_dict`), where the plain `head_options` dict stands for it."""
        if self.text_config is None:
            raise ValueError(f"This OutHeadsConfig has no text_config (backbone config). {FROM_BACKBONE}")
        dims, resolved, given = head_dims(self.text_config), self.__dict__.get(_RESOLVED), self.head_options
        if not isinstance(given, (dict, HeadOptions, type(None))):  # e.g. a hand-edited config.json
            raise ValueError(f"head_options must be a mapping of option: value (a JSON object in config.json), or the "
                             f"head's options object; got {given!r}.")
        if isinstance(given, HeadOptions) or resolved is None \
                or (resolved.head_type, resolved.resolved_for) != (self.head_type, dims) \
                or dataclasses.asdict(resolved) != given:
            if isinstance(given, HeadOptions) and given.head_type != self.head_type:
                raise ValueError(f"head_options are head '{given.head_type}''s options, not head '{self.head_type}''s: "
                                 f"pass head '{self.head_type}''s options or a dict, or omit head_type.")
            if not isinstance(given, HeadOptions):
                given = get_head_class(self.head_type).Options.from_dict(given)
            resolved = given.resolve(dims)
            self.__dict__[_RESOLVED] = resolved
        return resolved

    @property
    def head_class(self) -> type:
        """The class of the head the model builds: the one its resolved options belong to
        (`HeadOptions.head_class`), found when they were built, not looked up again."""
        return type(self.resolved_head_options).head_class

    def to_dict(self) -> dict[str, Any]:
        """As `PretrainedConfig.to_dict`, without the resolved options object (`head_options` holds them)."""
        output = super().to_dict()
        output.pop(_RESOLVED, None)
        return output


if __package__ == PACKAGE:  # the installed package registers; remote code's copy does not (transformers maps it itself)
    AutoConfig.register(OutHeadsConfig.model_type, OutHeadsConfig, exist_ok=True)
