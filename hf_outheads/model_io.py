"""Inputs, outputs and checks of the `OutHeadsFor*` model classes: the output classes, decoder
inputs from labels, the label check, and the check that a config's backbone suits the class
(a causal LM class on an encoder-decoder backbone, or the reverse, fails when it is built)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast, Seq2SeqLMOutput

from .head_interface import IGNORE_INDEX


@dataclass
class OutHeadsCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus terms of `loss`: `nll_loss`, the token-mean next-token NLL, and `aux_loss`,
    a head's per-micro-batch training term (DOC's regulariser; None for most heads); `loss` also holds a head's
    further token-mean terms (`mtp`'s future tokens), whose parts `aux_terms` names for logging
    (`{"mtp_nll_1": ...}`; None for most heads)."""

    nll_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    aux_terms: dict[str, torch.Tensor] | None = None


@dataclass
class OutHeadsSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus `nll_loss`, `aux_loss` and `aux_terms` (as `OutHeadsCausalLMOutput`)."""

    nll_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    aux_terms: dict[str, torch.Tensor] | None = None


def shift_right(labels: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels (`-100` becomes padding), as BART and T5 do it."""
    if decoder_start_token_id is None or pad_token_id is None:
        raise ValueError("Set decoder_start_token_id and pad_token_id on the config to train from labels.")
    shifted = labels.new_full(labels.shape, decoder_start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


def check_labels(labels: torch.Tensor, vocab_size: int) -> None:
    """Every label is -100 (ignored) or a word id in [0, vocab_size): one check for every head.
    Skipped while torch.compile traces, as `check_token_ids`: reading the check's result on the
    host would break the compiled graph and wait for the device at every training step."""
    if torch.compiler.is_compiling():
        return
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size))
    if bad.any():
        raise ValueError(
            f"labels must be -100 (ignored) or a token id in [0, {vocab_size}); got {labels[bad][:5].tolist()}. "
            "Mask padding with -100, and check the tokenizer matches the model's vocabulary."
        )


def embedding_rows(embedding) -> int:
    """Rows of an input embedding module, also when an adapter wraps it (PEFT: `get_base_layer()`)."""
    return (embedding.get_base_layer() if hasattr(embedding, "get_base_layer") else embedding).num_embeddings


def check_token_ids(ids: torch.Tensor | None, vocab_size: int, name: str = "input_ids") -> None:
    """Every input id is in [0, vocab_size): an id the embedding lacks (a tokenizer larger than
    the model) is a ValueError naming it, not the embedding's bare IndexError. One min/max
    reduction and one device-to-host copy per call, no Python loop over tokens; skipped while
    torch.compile traces."""
    if ids is None or ids.numel() == 0 or torch.compiler.is_compiling():
        return
    low, high = torch.stack(torch.aminmax(ids)).tolist()
    bad = high if high >= vocab_size else (low if low < 0 else None)
    if bad is not None:
        raise ValueError(
            f"{name} holds the token id {bad}, outside the model's vocabulary of {vocab_size} ids (0 to {vocab_size - 1}): "
            "the tokenizer has more tokens than the model has embeddings. Use the tokenizer the model was trained "
            "with, or grow the model with model.resize_token_embeddings(len(tokenizer)) (and train the new rows)."
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


# weight files of a save_pretrained folder (safetensors or torch, sharded or not, with their index)
WEIGHT_FILE = re.compile(r"(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?")


def save_then_swap(save, save_directory) -> None:
    """Run `save(folder)` (a `save_pretrained`) into a fresh folder inside `save_directory`, then
    move what it wrote into `save_directory`, `config.json` last, and remove the weight files of
    an earlier save that this one did not write. A save that fails (a full disk) leaves the
    earlier save as it was: transformers writes `config.json` first and the weights in place."""
    save_directory = os.fspath(save_directory)
    os.makedirs(save_directory, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".saving-", dir=save_directory)
    try:
        save(staging)
        written = sorted(os.listdir(staging), key=lambda name: name == "config.json")
        for name in written[:-1] if written and written[-1] == "config.json" else written:
            os.replace(os.path.join(staging, name), os.path.join(save_directory, name))
        for name in os.listdir(save_directory):
            if WEIGHT_FILE.fullmatch(name) and name not in written:
                os.remove(os.path.join(save_directory, name))
        if "config.json" in written:
            os.replace(os.path.join(staging, "config.json"), os.path.join(save_directory, "config.json"))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
