"""Backbones for training: a named size preset trained from scratch, or a pretrained
checkpoint converted with `from_backbone`. The head always comes from the options."""

from __future__ import annotations

from transformers import AutoConfig

import hf_outheads
from hf_outheads import OutHeadsConfig
from hf_outheads.training.flops import training_flops_per_step

# name -> (model_type, config fields). Vocabulary size and special ids come from the tokenizer.
PRESETS = {
    "gpt2-tiny": ("gpt2", dict(n_embd=128, n_layer=2, n_head=4, n_positions=512)),
    "gpt2-small": ("gpt2", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024)),  # GPT-2 small sizes
    "llama-tiny": ("llama", dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)),
    "llama-small": ("llama", dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=8, num_attention_heads=8,
                                  num_key_value_heads=8, max_position_embeddings=1024, tie_word_embeddings=False)),
    "t5-tiny": ("t5", dict(d_model=128, d_ff=512, d_kv=32, num_layers=2, num_heads=4)),
    "t5-small": ("t5", dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8)),  # t5-small sizes
    "bart-tiny": ("bart", dict(d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                               decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512,
                               max_position_embeddings=512)),
    "bart-small": ("bart", dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                                decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                                max_position_embeddings=1024)),
}
# every backbone config field that holds a dropout probability, across the preset families
DROPOUT_FIELDS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout",
                  "dropout", "dropout_rate", "activation_dropout", "classifier_dropout")


def model_class(task: str):
    """The model class of `task`, imported on this first use (a run's options are checked without it)."""
    return hf_outheads.OutHeadsForSeq2SeqLM if task == "seq2seq" else hf_outheads.OutHeadsForCausalLM


def _set_dropout(config, dropout: float | None) -> None:
    if dropout is None:
        return
    for name in DROPOUT_FIELDS:
        if isinstance(getattr(config, name, None), float):
            setattr(config, name, dropout)


def check_backbone(options) -> None:
    """Exactly one of `model_preset` and `pretrained`, and a preset that exists and fits the task:
    checked before any work starts (`preflight.check_run`), which `build_model` relies on."""
    model = options.model
    if bool(model.model_preset) == bool(model.pretrained):
        raise ValueError(f"Set exactly one of model_preset (train from scratch) and pretrained (convert a checkpoint); "
                         f"got model_preset={model.model_preset!r}, pretrained={model.pretrained!r}. "
                         "A --pretrained or --model_preset flag replaces the config file's choice.")
    if model.model_preset:
        if model.model_preset not in PRESETS:
            raise ValueError(f"Unknown model_preset {model.model_preset!r}. Valid presets: {sorted(PRESETS)}.")
        model_type = PRESETS[model.model_preset][0]
        if AutoConfig.for_model(model_type).is_encoder_decoder != (model.task == "seq2seq"):
            raise ValueError(f"Preset {model.model_preset} ({model_type}) does not fit task={model.task}.")


def positions(text_config) -> int | None:
    """The backbone's number of positions (`n_positions` / `max_position_embeddings`); None for
    relative-position backbones such as T5."""
    value = getattr(text_config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_lengths(options, text_config) -> None:
    """The lengths a run feeds the backbone (`block_size`; seq2seq: `max_source_length` and
    `max_target_length`) within its positions: checked before any work starts
    (`preflight.check_run`, where the config is known without a download), which `build_model`
    relies on."""
    limit = positions(text_config)
    names = ("block_size",) if options.model.task == "causal_lm" else ("max_source_length", "max_target_length")
    for name in names:
        if limit is not None and getattr(options.data, name) > limit:
            raise ValueError(f"Option {name}={getattr(options.data, name)} is larger than the {text_config.model_type} "
                             f"backbone's {limit} positions: lower {name} to at most {limit}"
                             + (", or give the preset more positions in model_overrides." if options.model.model_preset else "."))


def preset_config(options, tokenizer):
    model_type, fields = PRESETS[options.model.model_preset]
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
               eos_token_id=tokenizer.eos_token_id)
    if options.model.task == "seq2seq":
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id
        ids.update(decoder_start_token_id=start, forced_eos_token_id=None, forced_bos_token_id=None)
    return AutoConfig.for_model(model_type, **{**fields, **ids, **options.model.model_overrides})


def build_model(options, tokenizer):
    """A from-scratch preset or a converted pretrained model, with the run's head (`ModelOptions.head`,
    its options object). The options are those `preflight.check_run` passed: the backbone
    (`check_backbone`) and the lengths (`check_lengths`) are not checked again; what the tokenizer
    decides (its vocabulary against the embeddings) is checked here."""
    model_options = options.model
    cls, head = model_class(model_options.task), model_options.head
    if model_options.model_preset:
        text_config = preset_config(options, tokenizer)
        if text_config.vocab_size < len(tokenizer):
            raise ValueError(f"model_overrides.vocab_size = {text_config.vocab_size} is smaller than the tokenizer's "
                             f"{len(tokenizer)} tokens: ids from {text_config.vocab_size} on would have no embedding. "
                             "Drop vocab_size from model_overrides (it is the tokenizer's size by default) or raise it.")
        _set_dropout(text_config, model_options.dropout)
        return cls(OutHeadsConfig(text_config=text_config, head_options=head.options))
    config = AutoConfig.from_pretrained(model_options.pretrained)
    _set_dropout(config, model_options.dropout)
    for key, value in model_options.model_overrides.items():
        setattr(config, key, value)
    model = cls.from_backbone(model_options.pretrained, head_options=head.options, config=config)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens but {model_options.pretrained} only {model.config.vocab_size} "
                         "embeddings: use the pretrained model's own tokenizer (tokenizer: auto).")
    return model


def train_only(model, names: list[str]) -> None:
    """Freeze every parameter but those of the modules `names` (`trainable_modules`; none given: all
    train). A name that is no module of the model, or one without parameters, is a ValueError."""
    if not names:
        return
    modules = dict(model.named_modules())
    for name in names:
        if name in modules and any(True for _ in modules[name].parameters()):
            continue
        what = "a module without parameters" if name in modules else "no module"
        shallow = sorted(key for key in modules if key and key.count(".") <= 1)
        raise ValueError(f"Option trainable_modules: {name!r} is {what} of the model; its modules are named like "
                         f"{', '.join(shallow[:12])}, ...")
    trained = {id(p) for name in names for p in modules[name].parameters()}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in trained)


def without_dropout(model) -> None:
    """Every dropout of `model` off (`disable_dropout`): each `torch.nn.Dropout`'s p = 0, the head's
    too (TRL's `disable_dropout_in_model`); the config's rates are left as they are."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def parameter_counts(model) -> dict[str, int]:
    """Total trainable parameters and those of the output head alone (a parameter partitioned by
    DeepSpeed ZeRO-3 counts its full size, `ds_numel`)."""
    total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    head = sum(getattr(p, "ds_numel", p.numel()) for p in model.head.parameters() if p.requires_grad)
    return {"parameters": total, "head_parameters": head}


def position_limit(model) -> int | None:
    """The model's backbone's number of positions (`positions`): the tokenizer's `model_max_length`."""
    return positions(model.config.text_config)


def step_sequences(options, processes: int) -> int:
    """Sequences of one optimizer step, over every process."""
    return options.training.per_device_train_batch_size * options.training.gradient_accumulation_steps * processes


def step_tokens(options, processes: int) -> int:
    """Tokens one optimizer step trains on, at the length limits (`block_size`; seq2seq: the target's):
    a causal LM's blocks are full, a seq2seq step's targets at most as long."""
    length = options.data.block_size if options.model.task == "causal_lm" else options.data.max_target_length
    return step_sequences(options, processes) * length


def step_flops(model, options, processes: int) -> int:
    """Analytic FLOPs of one optimizer step (`hf_outheads.training.flops`); seq2seq at the length limits."""
    sequences = step_sequences(options, processes)
    if options.model.task == "causal_lm":
        return training_flops_per_step(model, sequences * options.data.block_size, options.data.block_size)
    return training_flops_per_step(model, sequences * options.data.max_target_length, options.data.max_target_length,
                                   sequences * options.data.max_source_length, options.data.max_source_length)
