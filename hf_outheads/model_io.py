"""Inputs, outputs and checks of the `OutHeadsFor*` model classes: the output classes, decoder
inputs from labels, the label check, and the check that a config's backbone suits the class
(a causal LM class on an encoder-decoder backbone, or the reverse, fails when it is built)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast, Seq2SeqLMOutput

from .head_interface import IGNORE_INDEX


@dataclass
class OutHeadsCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the two terms of `loss` = `nll_loss + aux_loss`: the token-mean
    next-token NLL and a head's extra training term (DOC's regulariser; None for most heads)."""

    nll_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


@dataclass
class OutHeadsSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus the two terms of `loss` = `nll_loss + aux_loss` (as `OutHeadsCausalLMOutput`)."""

    nll_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


def shift_right(labels: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels (`-100` becomes padding), as BART and T5 do it."""
    if decoder_start_token_id is None or pad_token_id is None:
        raise ValueError("Set decoder_start_token_id and pad_token_id on the config to train from labels.")
    shifted = labels.new_full(labels.shape, decoder_start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


def check_labels(labels: torch.Tensor, vocab_size: int) -> None:
    """Every label is -100 (ignored) or a word id in [0, vocab_size): one check for every head."""
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size))
    if bad.any():
        raise ValueError(
            f"labels must be -100 (ignored) or a token id in [0, {vocab_size}); got {labels[bad][:5].tolist()}. "
            "Mask padding with -100, and check the tokenizer matches the model's vocabulary."
        )


def check_backbone_kind(model_class, config) -> None:
    """`model_class` (its `encoder_decoder` attribute) suits the config's backbone: the causal LM
    class on an encoder-decoder backbone (or the reverse) would build, then fail at its first
    forward; transformers' Auto classes cannot tell, since both classes share `OutHeadsConfig`."""
    text = config.text_config
    is_encoder_decoder = bool(getattr(text, "is_encoder_decoder", False))
    if is_encoder_decoder == model_class.encoder_decoder:
        return
    kind, right, auto = (("an encoder-decoder", "OutHeadsForSeq2SeqLM", "AutoModelForSeq2SeqLM") if is_encoder_decoder
                         else ("a decoder-only", "OutHeadsForCausalLM", "AutoModelForCausalLM"))
    raise ValueError(f"This model's backbone (`{text.model_type}`) is {kind} model, which {model_class.__name__} "
                     f"cannot run: load it with {right} (or {auto}).")
