"""Backbone differences as data: how the original LM head of each model family computes
its scores, so that a wrapped backbone with a plain head reproduces it exactly."""

from __future__ import annotations

from .head_interface import HeadDims

# model_type -> (config attribute, exponent): the final hidden state is multiplied by
# config.<attribute> ** exponent before the head, when the config's scale flag is set.
# T5 rescales its decoder output by d_model ** -0.5 (T5ForConditionalGeneration.forward).
TIED_OUTPUT_SCALE = {
    "t5": ("d_model", -0.5),
    "mt5": ("d_model", -0.5),
    "umt5": ("d_model", -0.5),
    "longt5": ("d_model", -0.5),
}

# Config attributes that say whether the family applies that scale, first one present wins:
# T5's `scale_decoder_outputs` (transformers 5, whose T5Config always sets tie_word_embeddings;
# False for T5 v1.1), else `tie_word_embeddings` (the flag before it).
OUTPUT_SCALE_FLAGS = ("scale_decoder_outputs", "tie_word_embeddings")

# Names of buffers of the original *ForConditionalGeneration / *ForCausalLM that hold a
# per-word output bias added to the logits (BART, mBART, Marian, Pegasus, Blenderbot).
OUTPUT_BIAS_BUFFERS = ("final_logits_bias",)

# Config attributes naming the embedding width d when it differs from hidden_size.
EMBED_WIDTH_ATTRIBUTES = ("embedding_size", "word_embed_proj_dim")
# model_type -> attribute naming the width of the final hidden state when the backbone
# projects it away from hidden_size (OPT's `project_out` maps back to word_embed_proj_dim).
OUTPUT_WIDTH_ATTRIBUTE = {"opt": "word_embed_proj_dim"}


def hidden_scale(text_config) -> float:
    """Factor applied to the final hidden state before the head (1.0 for most families)."""
    rule = TIED_OUTPUT_SCALE.get(text_config.model_type)
    flag = next((getattr(text_config, n) for n in OUTPUT_SCALE_FLAGS if getattr(text_config, n, None) is not None), False)
    if rule is None or not flag:
        return 1.0
    attribute, exponent = rule
    return float(getattr(text_config, attribute)) ** exponent


def num_layers(text_config) -> int:
    """Decoder depth: the layers whose states `output_hidden_states` returns for the head."""
    for name in ("num_decoder_layers", "decoder_layers", "num_hidden_layers"):
        value = getattr(text_config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"Cannot tell the number of layers of a '{text_config.model_type}' backbone.")


def head_dims(text_config) -> HeadDims:
    """`hidden_dim` (d_h) is the width of the backbone's output, `embed_dim` (d) that of E."""
    output_width = OUTPUT_WIDTH_ATTRIBUTE.get(text_config.model_type)
    hidden = getattr(text_config, output_width) if output_width else text_config.hidden_size
    embed = next((getattr(text_config, a) for a in EMBED_WIDTH_ATTRIBUTES if getattr(text_config, a, None)), hidden)
    return HeadDims(
        vocab_size=text_config.vocab_size, embed_dim=embed, hidden_dim=hidden, num_layers=num_layers(text_config)
    )
