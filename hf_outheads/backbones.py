"""Backbone differences as data: how the original LM head of each model family computes
its scores, so that a wrapped backbone with a plain head reproduces it exactly, and what no
head of this package can reproduce (`from_backbone` refuses it, naming the family and field)."""

from __future__ import annotations

from .compat import CACHE
from .head_options import HeadDims

# Config attributes that say whether T5 applies its output scale, first one present wins:
# T5's `scale_decoder_outputs` (transformers 5, whose T5Config always sets tie_word_embeddings;
# False for T5 v1.1), else `tie_word_embeddings` (the flag before it).
OUTPUT_SCALE_FLAGS = ("scale_decoder_outputs", "tie_word_embeddings")

# model_type -> (config attribute, exponent, flags): the final hidden state is multiplied by
# config.<attribute> ** exponent before the head; `flags`: config attributes, the first one present
# must be true (None: always). T5 rescales its decoder output by d_model ** -0.5
# (T5ForConditionalGeneration.forward; mT5 no longer does); MiniCPM3 and Inkling divide it by a width multiplier.
HIDDEN_SCALES = {
    "t5": ("d_model", -0.5, OUTPUT_SCALE_FLAGS),
    "umt5": ("d_model", -0.5, OUTPUT_SCALE_FLAGS),
    "longt5": ("d_model", -0.5, OUTPUT_SCALE_FLAGS),
    "switch_transformers": ("d_model", -0.5, ("tie_word_embeddings",)),
    "minicpm3": ("logits_scaling", -1.0, None),  # MiniCPM3ForCausalLM: hidden_states / logits_scaling
    "inkling_text": ("logits_mup_width_multiplier", -1.0, None),  # InklingForCausalLM
}

# model_type -> (config attribute, kind): what the original head does to its scores `z = W h + b`,
# read from the (decoder's text) config: "multiply": `z * value`; "divide": `z / value`;
# "softcap": `value * tanh(z / value)` (None: no cap). Read off each family's *ForCausalLM /
# *ForConditionalGeneration forward; `tests/test_families.py` converts every family transformers
# ships, so a family missing here shows up as one whose logits differ.
_SOFTCAPPED = ("gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "gemma4_unified",
               "gemma4_unified_text", "vaultgemma", "nanochat", "beam", "inkling2", "inkling2_text",
               "inkling2_loop_text", "t5gemma", "t5gemma2", "mistral_large4")
LOGIT_TRANSFORMS: dict[str, tuple[str, str]] = {
    **{family: ("final_logit_softcapping", "softcap") for family in _SOFTCAPPED},
    "recurrent_gemma": ("logits_soft_cap", "softcap"),
    "xlstm": ("output_logit_soft_cap", "softcap"),
    **{family: ("logit_scale", "multiply") for family in ("cohere", "cohere2", "cohere2_moe", "cohere_compass_text")},
    "hyperclovax": ("logits_scaling", "multiply"),
    "falcon_h1": ("lm_head_multiplier", "multiply"),
    **{family: ("logits_scaling", "divide") for family in ("granite", "granite_swa", "granitemoe", "granitemoe_swa",
                                                           "granitemoehybrid", "granitemoeshared")},
}

# model_type -> (config attribute, why no head here computes what the family's LM does when the attribute is
# set (not None); None: always).
UNREPRESENTABLE: dict[str, tuple[str | None, str]] = {
    **{family: ("unpadded_vocab_size", "its logits cover only the first unpadded_vocab_size words of the embedding's "
                                       "rows") for family in ("inkling_text", "inkling2_text", "inkling2_loop_text")},
    "prophetnet": (None, "its logits come from the decoder's n-gram prediction streams, not its last hidden state"),
    "xlm": (None, "XLMWithLMHeadModel's loss scores each position's own label (its labels are not shifted), and "
                  "with asm=True its head is an adaptive softmax"),
    "fsmt": (None, "its decoder scores with an output projection of its own, outside the embedding the head reads"),
    "xlnet": (None, "XLNetLMHeadModel's loss scores each position's own label (its labels are not shifted)"),
}

# model_type -> the name under which the family's backbone takes and returns its cache, where it is not `cache`
# (transformers' RWKV: its recurrent `state`, which RwkvForCausalLM carries between generation steps itself), or None
# for a family without one (OpenAI GPT: OpenAIGPTLMHeadModel.prepare_inputs_for_generation passes the whole
# sequence at every step). The wrapped model takes and returns the cache as `cache`, as for every other family, so
# that `generate` carries it, and without one reads the whole sequence at every step.
CACHE_NAMES: dict[str, str | None] = {"rwkv": "state", "openai-gpt": None}

# Names of buffers of the original *ForConditionalGeneration / *ForCausalLM that hold a
# per-word output bias added to the logits (BART, mBART, Marian, Pegasus, Blenderbot).
OUTPUT_BIAS_BUFFERS = ("final_logits_bias",)

# model_type -> {field: the field whose value it repeats}: config fields a plain export (`export_plain`) also writes,
# under the name that tools reading the family's original checkpoints look for: llama.cpp's convert_hf_to_gguf.py
# reads GPT-2's context length from `n_ctx` (GPT-2's own config.json has it; transformers 5's GPT2Config does not).
EXPORT_ALIASES: dict[str, dict[str, str]] = {"gpt2": {"n_ctx": "n_positions"}}

# Config attributes naming the embedding width d when it differs from hidden_size.
EMBED_WIDTH_ATTRIBUTES = ("embedding_size", "word_embed_proj_dim")
# model_type -> attribute naming the width of the final hidden state when the backbone
# projects it away from hidden_size (OPT's `project_out` maps back to word_embed_proj_dim).
OUTPUT_WIDTH_ATTRIBUTE = {"opt": "word_embed_proj_dim"}


def hidden_scale(text_config) -> float:
    """Factor applied to the final hidden state before the head (1.0 for most families)."""
    rule = HIDDEN_SCALES.get(text_config.model_type)
    if rule is None:
        return 1.0
    attribute, exponent, flags = rule
    flag = True if flags is None else next(
        (getattr(text_config, n) for n in flags if getattr(text_config, n, None) is not None), False)
    return float(getattr(text_config, attribute)) ** exponent if flag else 1.0


def cache_name(text_config) -> str | None:
    """The backbone's name for its cache (`CACHE_NAMES`; transformers' name, `compat.CACHE`, for most families,
    None: it has none)."""
    return CACHE_NAMES.get(text_config.model_type, CACHE)


def head_config(config):
    """The (sub-)config that holds the LM head's settings: the decoder's text config."""
    return config.get_text_config(decoder=True)


def logit_transform(config) -> tuple[float, float]:
    """`(scale, softcap)` of the family's LM head: scores `softcap * tanh(scale * z / softcap)`, or
    `scale * z` with softcap 0 (`LOGIT_TRANSFORMS`); `(1.0, 0.0)` for most families."""
    rule = LOGIT_TRANSFORMS.get(config.model_type)
    value = None if rule is None else getattr(head_config(config), rule[0], None)
    if value is None:
        return 1.0, 0.0
    kind = rule[1]
    if kind == "softcap":
        return 1.0, float(value)
    return (float(value) if kind == "multiply" else 1.0 / float(value)), 0.0


def with_logit_softcap(config, cap: float):
    """`config` (changed in place) whose family's LM head soft-caps its scores at `cap` (0: none), or
    a ValueError when the family has no field for a cap (`LOGIT_TRANSFORMS`)."""
    rule = LOGIT_TRANSFORMS.get(config.model_type)
    if rule is None or rule[1] != "softcap":
        raise ValueError(f"The '{config.model_type}' family's LM head applies no soft cap (its config has no field for "
                         f"one), so no stock checkpoint of it computes scores soft-capped at {cap:g}.")
    setattr(head_config(config), rule[0], float(cap) if cap else None)
    return config


def unrepresentable(config) -> str | None:
    """Why no head of this package computes the family's logits (`UNREPRESENTABLE`), or None."""
    rule = UNREPRESENTABLE.get(config.model_type)
    if rule is None:
        return None
    field, reason = rule
    if field is None:
        return f"in '{config.model_type}' {reason}"
    value = getattr(head_config(config), field, None)
    if value is None or field == "unpadded_vocab_size" and value >= config.vocab_size:  # (all of it: no slicing)
        return None
    return f"'{config.model_type}' sets {field}: {reason}"


def num_layers(text_config) -> int:
    """Decoder depth: the layers whose states `output_hidden_states` returns for the head."""
    for name in ("num_decoder_layers", "decoder_layers", "num_hidden_layers"):
        value = getattr(text_config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"Cannot tell the number of layers of a '{text_config.model_type}' backbone.")


def head_dims(text_config) -> HeadDims:
    """`hidden_dim` (d_h) is the width of the backbone's output, `embed_dim` (d) that of E; the
    family's logit transform (`logit_transform`), which heads that offer it apply by default."""
    sizes = head_config(text_config)  # a composite's (T5Gemma's, Gemma 3's) decoder text config
    output_width = OUTPUT_WIDTH_ATTRIBUTE.get(text_config.model_type)
    hidden = getattr(sizes, output_width) if output_width else sizes.hidden_size
    embed = next((getattr(sizes, a) for a in EMBED_WIDTH_ATTRIBUTES if getattr(sizes, a, None)), hidden)
    scale, softcap = logit_transform(text_config)
    return HeadDims(vocab_size=sizes.vocab_size, embed_dim=embed, hidden_dim=hidden,
                    num_layers=num_layers(sizes), logit_scale=scale, logit_softcap=softcap)
