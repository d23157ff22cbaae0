"""`OutHeadsConfig`: any backbone config (nested as `text_config`) plus an output-head spec."""

from __future__ import annotations

import dataclasses
from typing import Any

from transformers import AutoConfig, PretrainedConfig
from transformers.configuration_utils import SubConfigSpec

from .backbones import head_dims, hidden_scale
from .head_catalog import get_head_class


class OutHeadsConfig(PretrainedConfig):
    """Configuration of an `OutHeadsFor*` model.

    Args:
        text_config: the backbone's config (object, or dict with `model_type`).
        head_type: one of the registered heads (`linear`, `tied`, `bilinear`, ...).
        head_options: the head's hyper-parameters; omitted ones take the papers' defaults.
            Stored fully expanded, so a saved config states every value used.
        hidden_scale: factor on the final hidden state before the head; derived from the
            backbone family when omitted (T5 with tied embeddings: `d_model ** -0.5`).
        vocab_size: optional check; must equal the backbone's vocabulary size.

    Example: `OutHeadsConfig(text_config=GPT2Config(), head_type="tied")`.
    """

    model_type = "outheads"
    sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="gpt2")}

    text_config: dict | PretrainedConfig | None = None
    head_type: str = "tied"
    head_options: dict | None = None
    hidden_scale: float | None = None
    vocab_size: int | None = None
    is_encoder_decoder: bool = False
    tie_word_embeddings: bool = False  # the `tied` head reads E at call time: no weight is duplicated

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        text = self.text_config
        if self.vocab_size is not None and self.vocab_size != text.vocab_size:
            raise ValueError(
                f"vocab_size={self.vocab_size} does not match the backbone's vocab_size={text.vocab_size}. "
                "Resize the backbone (model.resize_token_embeddings) or drop vocab_size."
            )
        self.vocab_size = text.vocab_size
        self.is_encoder_decoder = bool(getattr(text, "is_encoder_decoder", False))
        if self.hidden_scale is None:
            self.hidden_scale = hidden_scale(text)
        self.head_options = dataclasses.asdict(self.build_head_options())

    def build_head_options(self) -> Any:
        """Parse and validate `head_options` for `head_type` against the backbone's sizes."""
        options = get_head_class(self.head_type).Options.from_dict(self.head_type, self.head_options)
        options.validate(head_dims(self.text_config))
        return options
